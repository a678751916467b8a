//! One list of cases that run over both transports, as rdma-core's `rs_send`/`send` switch
//! lets one test program serve both: `tests/tests/shared_tcp.rs` runs each over TCP
//! loopback, `tests/tests/softroce.rs` in a Soft-RoCE guest over verbs (a script made
//! from this list), and both judge what came out with [`check`]. What only one transport
//! has (its striping set-up, its adversaries, its admission of streams or queue pairs)
//! stays in its own tests beside these; the admission both share (memory, addresses) is
//! here.

#![allow(dead_code)] // each test binary uses its part

/// One case: a receiver, a sender, what must come of it.
pub struct Case {
    pub name: &'static str,
    /// The receiver's options (besides transport, address, `--gpu none`).
    pub recv: &'static [&'static str],
    /// The sender's options (besides `IP PORT`, transport, `--gpu none`, `--json`);
    /// `FILE` stands for the case's input file.
    pub send: &'static [&'static str],
    /// Random bytes made into the input file first; the receiver stores into a
    /// directory (`--output DIR`), and the stored copy must equal the input.
    pub file: Option<u64>,
    /// The file goes on the sender's standard input (`--input -`).
    pub stdin: bool,
    pub expect: Expect,
}

pub enum Expect {
    /// `transfers` transfers, each verified; with faults at 1/N, the chunks repaired are
    /// exactly those the sender's injector hit on their first sending.
    Verified {
        transfers: usize,
        faults: Option<u64>,
    },
    /// The sender fails (exit 1) with an error that contains this.
    Fails(&'static str),
}

/// The name a stored file gets (`--name`).
pub const STORED: &str = "shared.bin";

pub const CASES: &[Case] = &[
    Case {
        name: "odd_sizes_and_chunks",
        recv: &[],
        send: &["--size", "4100", "--chunk", "1000", "--depth", "3"],
        file: None,
        stdin: false,
        expect: Expect::Verified {
            transfers: 1,
            faults: None,
        },
    },
    Case {
        name: "many_small_chunks_deep",
        recv: &[],
        send: &["--size", "8MiB", "--chunk", "4KiB", "--depth", "64"],
        file: None,
        stdin: false,
        expect: Expect::Verified {
            transfers: 1,
            faults: None,
        },
    },
    Case {
        name: "a_file_of_odd_length",
        recv: &[],
        send: &["--input", "FILE", "--name", STORED, "--chunk", "4096"],
        file: Some(65537),
        stdin: false,
        expect: Expect::Verified {
            transfers: 1,
            faults: None,
        },
    },
    Case {
        name: "standard_input",
        recv: &[],
        send: &["--input", "-", "--name", STORED, "--chunk", "64KiB"],
        file: Some((1 << 20) + 3),
        stdin: true,
        expect: Expect::Verified {
            transfers: 1,
            faults: None,
        },
    },
    Case {
        name: "faults_at_1_in_100_repaired_exactly",
        recv: &[],
        send: &[
            "--size",
            "16MiB",
            "--chunk",
            "64KiB",
            "--verify",
            "checksum",
            "--test-inject-faults",
            "1/100",
        ],
        file: None,
        stdin: false,
        expect: Expect::Verified {
            transfers: 1,
            faults: Some(100),
        },
    },
    Case {
        name: "a_file_with_faults_at_1_in_3",
        recv: &[],
        send: &[
            "--input",
            "FILE",
            "--name",
            STORED,
            "--chunk",
            "64KiB",
            "--test-inject-faults",
            "1/3",
        ],
        file: Some((4 << 20) + 5),
        stdin: false,
        expect: Expect::Verified {
            transfers: 1,
            faults: Some(3),
        },
    },
    Case {
        name: "every_chunk_corrupt_fails_bounded",
        recv: &[],
        send: &[
            "--size",
            "1MiB",
            "--chunk",
            "64KiB",
            "--verify",
            "checksum",
            "--test-inject-faults",
            "1/1",
            "--max-resends",
            "2",
        ],
        file: None,
        stdin: false,
        expect: Expect::Fails("still failed their CRC32C"),
    },
    Case {
        name: "a_reused_connection",
        recv: &[],
        send: &[
            "--size",
            "4MiB",
            "--chunk",
            "256KiB",
            "--verify",
            "both",
            "--iters",
            "4",
            "--reuse-connection",
        ],
        file: None,
        stdin: false,
        expect: Expect::Verified {
            transfers: 4,
            faults: None,
        },
    },
    Case {
        name: "too_large_for_the_receiver",
        recv: &["--max-bytes", "1MiB"],
        send: &["--size", "2MiB"],
        file: None,
        stdin: false,
        expect: Expect::Fails("exceeds its --max-bytes 1 MiB"),
    },
    // Admission, before anything is allocated: the same limits and words whichever
    // transport the offer came by.
    Case {
        name: "more_than_its_max_memory",
        recv: &["--max-bytes", "64MiB", "--max-memory", "1MiB"],
        send: &["--size", "2MiB"],
        file: None,
        stdin: false,
        expect: Expect::Fails("over its --max-memory 1 MiB"),
    },
    Case {
        name: "an_address_not_allowed",
        // An address of TEST-NET-2: neither loopback nor the guests' 192.0.2.0/24.
        recv: &["--allow", "198.51.100.7"],
        send: &["--size", "4KiB"],
        file: None,
        stdin: false,
        expect: Expect::Fails("not in its --allow list"),
    },
];

/// What a case's run left.
pub struct Ran {
    pub rc: i32,
    /// The sender's stdout (its JSON) and stderr, as lines.
    pub stdout: String,
    pub stderr: String,
    /// Whether the stored copy equals the input (cases with a file).
    pub stored_equal: Option<bool>,
}

/// The chunks the sender's fault injector at `1/one_in` corrupts on their first sending,
/// of `chunks` chunks (the same function as `host`'s).
pub fn injected(chunks: u64, one_in: u64) -> Vec<u64> {
    let f = host::transfer::faults::FaultInjector {
        one_in,
        seed: 0x5eed,
    };
    (0..chunks).filter(|&c| f.hits(c, 0)).collect()
}

/// Whether `ran` is what `case` expects; why not, in words.
pub fn check(case: &Case, ran: &Ran) -> Result<(), String> {
    let said = || format!("stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    match case.expect {
        Expect::Fails(words) => {
            if ran.rc != 1 {
                return Err(format!(
                    "the sender should fail with exit 1, got {}; {}",
                    ran.rc,
                    said()
                ));
            }
            let error = ran.stderr.lines().find(|l| l.starts_with("error: "));
            match error {
                Some(e) if e.contains(words) => Ok(()),
                _ => Err(format!("no error line containing {words:?}; {}", said())),
            }
        }
        Expect::Verified { transfers, faults } => {
            if ran.rc != 0 {
                return Err(format!("the sender exited {}; {}", ran.rc, said()));
            }
            let doc: serde_json::Value = ran
                .stdout
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str(l).ok())
                .ok_or_else(|| format!("no JSON from the sender; {}", said()))?;
            let it = doc["iterations"].as_array().cloned().unwrap_or_default();
            if it.len() != transfers {
                return Err(format!(
                    "{} transfers reported, {transfers} expected",
                    it.len()
                ));
            }
            for (k, t) in it.iter().enumerate() {
                if t["receiver"]["status"] != "verified" {
                    return Err(format!("transfer {k}: {}", t["receiver"]));
                }
                if let Some(one_in) = faults {
                    let repaired: Vec<u64> = t["integrity"]["repaired"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|r| r["chunk"].as_u64()).collect())
                        .unwrap_or_default();
                    let hit = injected(t["chunks"].as_u64().unwrap_or(0), one_in);
                    if repaired != hit || hit.is_empty() {
                        return Err(format!(
                            "transfer {k}: repaired {repaired:?}, the injector hit {hit:?}"
                        ));
                    }
                }
            }
            match (case.file, ran.stored_equal) {
                (Some(_), Some(true)) | (None, _) => Ok(()),
                (Some(_), other) => Err(format!("the stored copy equals the input: {other:?}")),
            }
        }
    }
}

/// The cases as a scenario script for a guest (busybox ash, `lib.sh`'s helpers), over
/// `transport` to the receiver at `$RXE_ADDR`: a section per case, the receiver's and the
/// sender's outputs labelled `receiver` and `sender`, `@@VAL stored_equal=0|1@@`.
pub fn guest_script(transport: &str) -> String {
    let mut s = String::from(
        ". /opt/bin/lib.sh || exit 2\nA=$RXE_ADDR\n\
         # Made by tests/tests/shared_cases/mod.rs from its list: edit that, not this.\n",
    );
    for case in CASES {
        let quote = |args: &[&str]| -> String {
            args.iter()
                .map(|a| match *a {
                    "FILE" => "/tmp/shared.in".to_string(),
                    a => format!("'{a}'"),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        s.push_str(&format!("case_{}() {{\n", case.name));
        s.push_str("  rm -rf /tmp/shared.out && mkdir -p /tmp/shared.out\n");
        if let Some(len) = case.file {
            s.push_str(&format!("  head -c {len} /dev/urandom > /tmp/shared.in\n"));
        }
        s.push_str(&format!(
            "  start receiver host recv --transport {transport} --gpu none --timeout 10 --output /tmp/shared.out {}\n",
            quote(case.recv)
        ));
        s.push_str("  wait_for receiver \"receiver: listening\" 30\n");
        let sender = format!(
            "host \"$A\" 7471 --transport {transport} --gpu none --timeout 10 --json {}",
            quote(case.send)
        );
        match case.stdin {
            true => s.push_str(&format!(
                "  run sender 180 sh -c \"{} < /tmp/shared.in\"\n",
                sender.replace('"', "\\\"")
            )),
            false => s.push_str(&format!("  run sender 180 {sender}\n")),
        }
        s.push_str("  stop receiver\n");
        if case.file.is_some() {
            s.push_str(&format!(
                "  if cmp -s /tmp/shared.in /tmp/shared.out/{STORED}; then val stored_equal 1; else val stored_equal 0; fi\n"
            ));
        }
        s.push_str("}\n");
    }
    let names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    s.push_str(&format!(
        "for c in ${{*:-{}}}; do\n  case_begin \"$c\"\n  \"case_$c\"\n  case_end\ndone\nexit 0\n",
        names.join(" ")
    ));
    s
}
