//! `softroce_bench`: turns the `@@BENCH` lines of `tests/softroce/bench-guest.sh` (the
//! guest's console, as `run-guest.sh` prints it) into one JSON document: per message size
//! and operation our throughput and perftest's, measured in the same guest and the same
//! run, and their ratio; the 16 KiB latency of both. `tests/softroce/bench.sh` runs it.
//!
//! ```text
//! softroce_bench [--command TEXT] [--setting KEY=VALUE]... [FILE]   (stdin without FILE)
//! ```
//!
//! Units: MB/s is 10^6 bytes per second. perftest reports MiB/s (its "MB/sec" is
//! 0x100000 bytes per second: perftest_parameters.c, `format_factor`), converted here.
//! Every figure is the median over the rounds; the single runs are listed next to it.

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Read;
use std::process::ExitCode;

const MIB: f64 = 1_048_576.0;

/// One `@@BENCH` line.
#[derive(Debug, Clone, PartialEq)]
enum Record {
    Env {
        key: String,
        value: String,
    },
    Run {
        tool: Tool,
        test: String,
        size: u64,
        messages: u64,
        round: u32,
        rc: i32,
        /// Runs it took (perftest is repeated when its clock calibration failed).
        attempts: u32,
        payload: String,
    },
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tool {
    Perftest,
    Ours,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::Perftest => "perftest",
            Tool::Ours => "ours",
        }
    }
}

/// Parse one console line; `None` for lines that are not ours.
fn parse_line(line: &str) -> Option<Record> {
    let at = line.find("@@BENCH ")?;
    let rest = &line[at + "@@BENCH ".len()..];
    let (head, payload) = match rest.split_once(" | ") {
        Some((h, p)) => (h.trim(), p.trim()),
        None => (rest.trim_end_matches(" |").trim(), ""),
    };
    let mut words = head.split_whitespace();
    match words.next()? {
        "env" => Some(Record::Env {
            key: words.next()?.to_string(),
            value: payload.to_string(),
        }),
        "done" => Some(Record::Done),
        tool @ ("perftest" | "ours") => {
            let tool = if tool == "ours" {
                Tool::Ours
            } else {
                Tool::Perftest
            };
            let test = words.next()?.to_string();
            let mut fields = BTreeMap::new();
            for w in words {
                let (k, v) = w.split_once('=')?;
                fields.insert(k, v);
            }
            Some(Record::Run {
                tool,
                test,
                size: fields.get("size")?.parse().ok()?,
                messages: fields.get("n")?.parse().ok()?,
                round: fields.get("round")?.parse().ok()?,
                rc: fields.get("rc")?.parse().ok()?,
                attempts: fields
                    .get("attempts")
                    .and_then(|a| a.parse().ok())
                    .unwrap_or(1),
                payload: payload.to_string(),
            })
        }
        _ => None,
    }
}

/// perftest's bandwidth result line: `#bytes #iterations BW-peak BW-average MsgRate`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PerftestBw {
    peak_mib_s: f64,
    average_mib_s: f64,
}

/// The numbers of a result line; `None` if any is not a finite number (perftest prints
/// `inf` and `-nan` when its clock calibration failed).
fn numbers(line: &str) -> Option<Vec<f64>> {
    line.split_whitespace()
        .map(|w| w.parse::<f64>().ok().filter(|x| x.is_finite()))
        .collect()
}

fn parse_perftest_bw(line: &str) -> Option<PerftestBw> {
    let f = numbers(line)?;
    // 0.00: the clock calibration failed (as with inf), not a stalled link.
    (f.len() >= 5 && f[3] > 0.0).then(|| PerftestBw {
        peak_mib_s: f[2],
        average_mib_s: f[3],
    })
}

/// perftest's latency result line: `#bytes #iterations t_min t_max t_typical t_avg
/// t_stdev 99% 99.9%`, in microseconds; t_typical is the median, and every figure is
/// half a round trip.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PerftestLat {
    min_us: f64,
    typical_us: f64,
    avg_us: f64,
    p99_us: f64,
}

fn parse_perftest_lat(line: &str) -> Option<PerftestLat> {
    let f = numbers(line)?;
    (f.len() >= 8 && f[4] > 0.0).then(|| PerftestLat {
        min_us: f[2],
        typical_us: f[4],
        avg_us: f[5],
        p99_us: f[7],
    })
}

fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn num(x: Option<f64>) -> Value {
    x.map_or(Value::Null, |x| json!(round3(x)))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if a.is_finite() && b.is_finite() && b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn size_name(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Everything measured, grouped.
#[derive(Default)]
struct Collected {
    env: Map<String, Value>,
    /// (test, size) -> (messages, perftest runs, our runs, all ours verified)
    bw: BTreeMap<(String, u64), BwRuns>,
    lat_perftest: Vec<PerftestLat>,
    lat_ours: Vec<Value>,
    lat_ours_event: Vec<Value>,
    lat_size: Option<u64>,
    lat_iters: Option<u64>,
    errors: Vec<String>,
    /// perftest runs repeated because they measured nothing (failed clock calibration).
    perftest_repeats: u32,
    done: bool,
}

#[derive(Default)]
struct BwRuns {
    messages: u64,
    perftest: Vec<PerftestBw>,
    ours_mb_s: Vec<f64>,
    ours_verified: bool,
    ours_seen: bool,
}

fn collect(text: &str) -> Collected {
    let mut c = Collected::default();
    for record in text.lines().filter_map(parse_line) {
        match record {
            Record::Env { key, value } => {
                c.env.insert(key, Value::String(value));
            }
            Record::Done => c.done = true,
            Record::Run {
                tool,
                test,
                size,
                messages,
                round,
                rc,
                attempts,
                payload,
            } => {
                c.perftest_repeats += attempts.saturating_sub(1);
                let what = format!("{} {test} {} round {round}", tool.name(), size_name(size));
                if rc != 0 {
                    c.errors.push(format!("{what}: exit code {rc} ({payload})"));
                    continue;
                }
                match (tool, test.as_str()) {
                    (Tool::Perftest, "send_lat") => match parse_perftest_lat(&payload) {
                        Some(l) => {
                            c.lat_perftest.push(l);
                            c.lat_size = Some(size);
                            c.lat_iters = Some(messages);
                        }
                        None => c.errors.push(format!("{what}: no result in `{payload}`")),
                    },
                    (Tool::Perftest, _) => match parse_perftest_bw(&payload) {
                        Some(bw) => {
                            let runs = c.bw.entry((test, size)).or_default();
                            runs.messages = messages;
                            runs.perftest.push(bw);
                        }
                        None => c.errors.push(format!("{what}: no result in `{payload}`")),
                    },
                    (Tool::Ours, t) => {
                        let v: Value = match serde_json::from_str(&payload) {
                            Ok(v) => v,
                            Err(e) => {
                                c.errors.push(format!("{what}: bad JSON ({e})"));
                                continue;
                            }
                        };
                        let ok = v["ok"].as_bool() == Some(true);
                        if !ok {
                            c.errors
                                .push(format!("{what}: the receiver did not verify the data"));
                        }
                        match t {
                            "send_lat" => c.lat_ours.push(v),
                            "send_lat_event" => c.lat_ours_event.push(v),
                            _ => {
                                let runs = c.bw.entry((test, size)).or_default();
                                if !runs.ours_seen {
                                    runs.ours_verified = true;
                                    runs.ours_seen = true;
                                }
                                runs.ours_verified &= ok;
                                runs.messages = messages;
                                match v["aggregate"]["gb_per_s"].as_f64() {
                                    Some(gbps) => runs.ours_mb_s.push(gbps * 1000.0),
                                    None => c.errors.push(format!("{what}: no throughput")),
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    c
}

fn round_trip_field(runs: &[Value], field: &str) -> Vec<f64> {
    runs.iter()
        .filter_map(|v| v["round_trip"][field].as_f64())
        .collect()
}

fn report(c: &Collected, command: &str, settings: &Map<String, Value>) -> Value {
    let mut throughput = Vec::new();
    let mut goals = Map::new();
    for ((test, size), runs) in &c.bw {
        let perftest_mb_s: Vec<f64> = runs
            .perftest
            .iter()
            .map(|r| r.average_mib_s * MIB / 1e6)
            .collect();
        let perftest_peak: Vec<f64> = runs
            .perftest
            .iter()
            .map(|r| r.peak_mib_s * MIB / 1e6)
            .collect();
        let ours = median(&runs.ours_mb_s);
        let theirs = median(&perftest_mb_s);
        let r = ratio(ours, theirs);
        let op = test.trim_end_matches("_bw");
        throughput.push(json!({
            "op": op,
            "message": size_name(*size),
            "message_bytes": size,
            "messages": runs.messages,
            "ours_mb_s": num(ours),
            "perftest_mb_s": num(theirs),
            "ratio": num(r),
            "ours_runs_mb_s": runs.ours_mb_s.iter().map(|x| round3(*x)).collect::<Vec<_>>(),
            "perftest_runs_mb_s": perftest_mb_s.iter().map(|x| round3(*x)).collect::<Vec<_>>(),
            "perftest_peak_runs_mb_s": perftest_peak.iter().map(|x| round3(*x)).collect::<Vec<_>>(),
            "ours_all_verified": runs.ours_seen && runs.ours_verified,
        }));
        if *size == 1 << 20 {
            goals.insert(
                format!("{op}_1MiB_throughput_at_least_perftest"),
                json!({ "ratio": num(r), "goal": ">= 1.0", "met": r.is_some_and(|r| r >= 1.0) }),
            );
        }
    }

    let pt_typical: Vec<f64> = c.lat_perftest.iter().map(|l| l.typical_us).collect();
    let pt_one_way = median(&pt_typical);
    let pt_rtt = pt_one_way.map(|x| 2.0 * x);
    let ours_rtt = median(&round_trip_field(&c.lat_ours, "median_us"));
    let ours_verify = median(&round_trip_field(&c.lat_ours, "verify_median_us"));
    let ours_rtt_event = median(&round_trip_field(&c.lat_ours_event, "median_us"));
    let lat_ratio = ratio(ours_rtt, pt_rtt);
    let ours_without_verify = match (ours_rtt, ours_verify) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    let lat_name = c.lat_size.map_or_else(|| "?".into(), size_name);
    let latency = json!({
        "message": lat_name,
        "message_bytes": c.lat_size,
        "iterations": c.lat_iters,
        "perftest_one_way_typical_us": num(pt_one_way),
        "perftest_round_trip_us": num(pt_rtt),
        "ours_round_trip_median_us": num(ours_rtt),
        "ratio": num(lat_ratio),
        "ours_receiver_verification_median_us": num(ours_verify),
        "ours_round_trip_less_verification_us": num(ours_without_verify),
        "ratio_less_verification": num(ratio(ours_without_verify, pt_rtt)),
        "ours_event_mode_round_trip_median_us": num(ours_rtt_event),
        "runs": {
            "perftest_typical_one_way_us": pt_typical.iter().map(|x| round3(*x)).collect::<Vec<_>>(),
            "perftest_min_one_way_us": c.lat_perftest.iter().map(|l| round3(l.min_us)).collect::<Vec<_>>(),
            "perftest_avg_one_way_us": c.lat_perftest.iter().map(|l| round3(l.avg_us)).collect::<Vec<_>>(),
            "perftest_p99_one_way_us": c.lat_perftest.iter().map(|l| round3(l.p99_us)).collect::<Vec<_>>(),
            "ours_round_trip_median_us": round_trip_field(&c.lat_ours, "median_us"),
            "ours_round_trip_min_us": round_trip_field(&c.lat_ours, "min_us"),
            "ours_round_trip_mean_us": round_trip_field(&c.lat_ours, "mean_us"),
            "ours_receiver_verification_median_us": round_trip_field(&c.lat_ours, "verify_median_us"),
            "ours_event_mode_round_trip_median_us": round_trip_field(&c.lat_ours_event, "median_us"),
        },
        "what_is_measured": {
            "perftest": "ib_send_lat -R: ping-pong of two SENDs of the message size, both sides busy-polling; t_typical is the median of (round trip / 2), so its round trip is 2 x t_typical",
            "ours": "host --reuse-connection --iters N --busy-poll against host recv --busy-poll: per transfer, the time from posting the SEND of the message to the arrival of the receiver's 48-byte ack, sent after it verified the data on the CPU (pattern check + CRC-32); the median over N transfers on one connection",
            "ratio": "ours_round_trip_median_us / perftest_round_trip_us (goal <= 1.2); perftest's round trip moves the message both ways, ours moves it one way plus a 48-byte ack and includes the verification",
        },
    });
    goals.insert(
        format!(
            "{}_latency_within_1.2x_perftest",
            lat_name.replace(' ', "")
        ),
        json!({ "ratio": num(lat_ratio), "goal": "<= 1.2", "met": lat_ratio.is_some_and(|r| r <= 1.2) }),
    );

    json!({
        "benchmark": "host (this project) vs perftest on Soft-RoCE (rdma_rxe), same guest, same run",
        "command": command,
        "environment": c.env,
        "settings": settings,
        "units": "MB/s = 10^6 bytes/s (perftest's MiB/s converted); us = microseconds; each figure is the median over the rounds",
        "throughput_what_is_measured": {
            "perftest": "ib_send_bw -R / ib_write_bw -R client: BW average = messages x size / (last completion - first post), on the sender, TSC-timed",
            "ours": "host <ip> <port> --op send|write --size messages x size --chunk size: first work request posted to the last data completion, on the sender, monotonic clock; the receiver verifies afterwards (not timed)",
            "ratio": "ours_mb_s / perftest_mb_s (goal at 1 MiB: >= 1.0)",
        },
        "throughput": throughput,
        "latency": latency,
        "goals": goals,
        "perftest_runs_repeated_after_failed_clock_calibration": c.perftest_repeats,
        "complete": c.done && c.errors.is_empty(),
        "errors": c.errors,
    })
}

fn main() -> ExitCode {
    let mut command = String::new();
    let mut settings = Map::new();
    let mut file: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--command" => command = args.next().unwrap_or_default(),
            "--setting" => {
                let kv = args.next().unwrap_or_default();
                let (k, v) = kv.split_once('=').unwrap_or((&kv, ""));
                let value = match (v.parse::<i64>(), v.parse::<f64>()) {
                    (Ok(i), _) => json!(i),
                    (_, Ok(x)) => json!(x),
                    _ => json!(v),
                };
                settings.insert(k.to_string(), value);
            }
            "-h" | "--help" => {
                eprintln!("usage: softroce_bench [--command TEXT] [--setting KEY=VALUE]... [FILE]");
                return ExitCode::SUCCESS;
            }
            f => file = Some(f.to_string()),
        }
    }
    let mut text = String::new();
    let read = match &file {
        Some(f) => std::fs::read_to_string(f).map(|t| text = t),
        None => std::io::stdin().read_to_string(&mut text).map(|_| ()),
    };
    if let Err(e) = read {
        eprintln!(
            "softroce_bench: cannot read {}: {e}",
            file.as_deref().unwrap_or("stdin")
        );
        return ExitCode::from(2);
    }
    let c = collect(&text);
    let out = report(&c, &command, &settings);
    println!(
        "{}",
        serde_json::to_string_pretty(&out).expect("JSON values serialize")
    );
    if c.bw.is_empty() && c.lat_perftest.is_empty() {
        eprintln!("softroce_bench: no measurements in the input");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    // Lines as the guest console shows them (perftest 4.5 / 24.x output, run-guest prefix).
    const SAMPLE: &str = "\
[a] @@BENCH env kernel | 6.1.0-57-amd64
[a] @@BENCH perftest send_bw size=1048576 n=200 round=1 rc=0 |  1048576    200              139.56             62.61  \t\t   0.000063
[a] @@BENCH ours send_bw size=1048576 n=200 round=1 rc=0 | {\"ok\":true,\"aggregate\":{\"bytes\":209715200,\"gb_per_s\":0.082,\"seconds\":2.5,\"transfers\":1},\"round_trip\":null}
[a] @@BENCH perftest send_bw size=1048576 n=200 round=2 rc=0 |  1048576    200              100.00             50.00  \t\t   0.000050
[a] @@BENCH ours send_bw size=1048576 n=200 round=2 rc=0 | {\"ok\":true,\"aggregate\":{\"bytes\":209715200,\"gb_per_s\":0.104,\"seconds\":2.0,\"transfers\":1},\"round_trip\":null}
[a] @@BENCH perftest send_lat size=16384 n=1000 round=1 rc=0 |  16384   1000          128.77         6652.60      172.55   \t       194.64      \t149.74 \t\t1001.50 \t\t6652.60
[a] @@BENCH ours send_lat size=16384 n=1000 round=1 rc=0 | {\"ok\":true,\"aggregate\":{\"gb_per_s\":0.06},\"round_trip\":{\"transfers\":1000,\"median_us\":318.9,\"min_us\":272.4,\"mean_us\":351.8,\"max_us\":7378.4,\"verify_median_us\":71.0}}
[a] @@BENCH ours write_bw size=4096 n=16384 round=1 rc=1 | {\"ok\":false,\"aggregate\":null,\"round_trip\":null}
[a] @@BENCH done | a
";

    #[test]
    fn lines_are_parsed() {
        assert_eq!(parse_line("[a] random console noise"), None);
        assert_eq!(
            parse_line("[a] @@BENCH env kernel | 6.1.0"),
            Some(Record::Env {
                key: "kernel".into(),
                value: "6.1.0".into()
            })
        );
        let Some(Record::Run {
            tool,
            size,
            messages,
            round,
            rc,
            ..
        }) = parse_line(
            "[a] @@BENCH perftest send_bw size=4096 n=16384 round=2 rc=0 |  4096 16384 1.0 2.0 0.1",
        )
        else {
            panic!("not a run")
        };
        assert_eq!(
            (tool, size, messages, round, rc),
            (Tool::Perftest, 4096, 16384, 2, 0)
        );
        // An empty payload (a run that printed no result) still parses.
        assert!(matches!(
            parse_line("[a] @@BENCH perftest send_bw size=4096 n=5 round=1 rc=1 | "),
            Some(Record::Run { rc: 1, .. })
        ));
    }

    #[test]
    fn perftest_result_lines() {
        let bw = parse_perftest_bw(
            " 1048576    200              139.56             62.61  \t\t   0.000063",
        )
        .unwrap();
        assert_eq!((bw.peak_mib_s, bw.average_mib_s), (139.56, 62.61));
        assert_eq!(parse_perftest_bw(""), None);
        assert_eq!(parse_perftest_bw(" Couldn't connect"), None);
        let lat = parse_perftest_lat(
            " 16384   1000          128.77         6652.60      172.55   \t       194.64      \t149.74 \t\t1001.50 \t\t6652.60",
        )
        .unwrap();
        assert_eq!(
            (lat.min_us, lat.typical_us, lat.avg_us),
            (128.77, 172.55, 194.64)
        );
        assert_eq!(lat.p99_us, 1001.50);
        // A failed clock calibration: no result, not an infinitely slow one.
        assert_eq!(
            parse_perftest_lat(" 16384   200          inf            inf          inf      \t       inf         \t-nan   \t\tinf     \t\tinf    "),
            None
        );
        assert_eq!(parse_perftest_bw(" 1048576 200 0.00 inf 0.0"), None);
        assert_eq!(
            parse_perftest_bw(
                " 4096       16384            0.00               0.00   \t\t   0.000000"
            ),
            None
        );
        assert_eq!(ratio(Some(1.0), Some(f64::INFINITY)), None);
        assert_eq!(ratio(Some(1.0), None), None);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn the_report_compares_like_with_like() {
        let c = collect(SAMPLE);
        assert!(c.done);
        let out = report(&c, "tests/softroce/bench.sh", &Map::new());
        let t = &out["throughput"][0];
        assert_eq!(t["op"], "send");
        assert_eq!(t["message_bytes"], 1048576);
        // perftest: median of 62.61 and 50.00 MiB/s = 56.305 MiB/s = 59.04 MB/s.
        let perftest = t["perftest_mb_s"].as_f64().unwrap();
        assert!((perftest - 56.305 * MIB / 1e6).abs() < 0.01, "{perftest}");
        // ours: median of 82 and 104 MB/s = 93.
        assert_eq!(t["ours_mb_s"].as_f64().unwrap(), 93.0);
        let r = t["ratio"].as_f64().unwrap();
        assert!((r - 93.0 / perftest).abs() < 0.01);
        assert_eq!(t["ours_all_verified"], true);
        assert_eq!(
            out["goals"]["send_1MiB_throughput_at_least_perftest"]["met"],
            true
        );
        let l = &out["latency"];
        assert_eq!(l["perftest_round_trip_us"].as_f64().unwrap(), 345.1);
        assert_eq!(l["ours_round_trip_median_us"].as_f64().unwrap(), 318.9);
        assert_eq!(
            l["ours_round_trip_less_verification_us"].as_f64().unwrap(),
            247.9
        );
        let lr = l["ratio"].as_f64().unwrap();
        assert!((lr - 318.9 / 345.1).abs() < 0.001);
        assert_eq!(
            out["goals"]["16KiB_latency_within_1.2x_perftest"]["met"],
            true
        );
        // The failed run is reported, and the run is not complete.
        assert_eq!(out["complete"], false);
        assert_eq!(out["errors"].as_array().unwrap().len(), 1);
    }
}
