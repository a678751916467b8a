//! One module per subcommand; each turns parsed arguments into the library's typed
//! configuration, runs it and prints the result (for people, or `--json`).

pub mod crc_bench;
pub mod doctor;
mod facts;
pub mod gpu;
pub mod info;
mod output;
mod peer;
mod rails;
pub mod rails_bench;
pub mod recv;
pub mod send;
mod tcp;
pub mod tcp_bench;
