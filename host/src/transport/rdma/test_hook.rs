//! A stopgap for the Soft-RoCE tests until the command line has `--verify`,
//! `--max-resends`, `--test-inject-faults` (sender) and `--output` (receiver), which are
//! being added with the TCP half of version 2: the verbs transport takes these settings
//! from the environment, where the configuration still holds its defaults. Read here and
//! nowhere else; to be removed once the options set the fields themselves.
//!
//! | variable | field |
//! | --- | --- |
//! | `GRDM_TEST_VERIFY=pattern\|checksum\|both\|off` | `SendConfig::verify` |
//! | `GRDM_TEST_MAX_RESENDS=N` | `SendConfig::max_resends` |
//! | `GRDM_TEST_INJECT_FAULTS=1/N` | `SendConfig::faults` |
//! | `GRDM_TEST_PAYLOAD=opaque` | `SendConfig::payload` |
//! | `GRDM_TEST_OUTPUT=PATH\|-` | `RecvConfig::output` |

use super::{RecvConfig, SendConfig};
use crate::transfer::faults::FaultInjector;
use crate::transfer::header::{Payload, VerifyMode, DEFAULT_MAX_RESENDS};
use crate::transfer::store::Output;
use crate::transfer::TransferError;
use clap::ValueEnum;

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn bad(name: &str, why: impl std::fmt::Display) -> TransferError {
    TransferError::Protocol(format!("{name}: {why}"))
}

/// The sender's configuration with the test settings of the environment.
pub fn sender(cfg: &SendConfig) -> Result<SendConfig, TransferError> {
    let mut cfg = cfg.clone();
    if let Some(v) = var("GRDM_TEST_VERIFY") {
        if cfg.verify == VerifyMode::Pattern {
            cfg.verify = VerifyMode::from_str(&v, true).map_err(|e| bad("GRDM_TEST_VERIFY", e))?;
        }
    }
    if let Some(v) = var("GRDM_TEST_MAX_RESENDS") {
        if cfg.max_resends == DEFAULT_MAX_RESENDS {
            cfg.max_resends = v.parse().map_err(|e| bad("GRDM_TEST_MAX_RESENDS", e))?;
        }
    }
    if let Some(v) = var("GRDM_TEST_INJECT_FAULTS") {
        if cfg.faults.is_none() {
            cfg.faults =
                Some(FaultInjector::parse(&v).map_err(|e| bad("GRDM_TEST_INJECT_FAULTS", e))?);
        }
    }
    if var("GRDM_TEST_PAYLOAD").as_deref() == Some("opaque") && cfg.payload == Payload::Pattern {
        cfg.payload = Payload::Opaque;
        if cfg.verify.pattern() {
            cfg.verify = VerifyMode::Checksum;
        }
    }
    Ok(cfg)
}

/// The receiver's configuration with the test settings of the environment.
pub fn receiver(cfg: &RecvConfig) -> Result<RecvConfig, TransferError> {
    let mut cfg = cfg.clone();
    if let Some(v) = var("GRDM_TEST_OUTPUT") {
        if cfg.output.is_none() {
            cfg.output =
                Some(Output::parse(&v).map_err(|e| bad("GRDM_TEST_OUTPUT", format!("{e:#}")))?);
        }
    }
    Ok(cfg)
}
