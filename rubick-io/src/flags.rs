//! The numbers of the command line, each concept bounded once, where clap parses it
//! (`#[arg(long, value_parser = rubick_io::flags::seconds)]`). Every command that
//! takes a concept takes it through the same parser, so `schedule`, `simulate` and
//! `trace` accept exactly the same values; a value out of bounds (NaN and the
//! infinities included) is a usage error, exit 2, that names the flag and what it
//! expects, before anything is read or written. Such a flag also sets
//! `allow_hyphen_values`, so that `-1` or `-inf` reaches its bound (and is refused
//! naming the flag) instead of being taken for an unknown flag.

use rubick_core::launch::{MAX_SECONDS, check_seconds};
use rubick_core::limits::{MAX_CLOCK_SECONDS, check_real, shown};

/// The number `text` says (Rust's float syntax: `nan` and `inf` parse, for the bounds to
/// refuse them by name).
fn number(text: &str) -> Result<f64, String> {
    text.trim().parse().map_err(|_| format!("expected a number, got `{text}`"))
}

/// A share, 0 to 1 (of jobs, of throughput).
pub fn share(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    check_real(v, 0.0, 1.0, false).map(|()| v).map_err(|_| format!("expected a share from 0 to 1, got {}", shown(v)))
}

/// The largest [`ratio`]: a gain of a million times is beyond any configuration's.
pub const MAX_RATIO: f64 = 1e6;

/// A non-negative ratio (a gain, a margin, an efficiency: shares of a throughput that
/// may exceed 1), 0 to [`MAX_RATIO`].
pub fn ratio(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    check_real(v, 0.0, MAX_RATIO, false)
        .map(|()| v)
        .map_err(|_| format!("expected a number from 0 to {MAX_RATIO:e}, got {}", shown(v)))
}

/// A duration in seconds, 0 to a week ([`check_seconds`]: a restart's cost, a horizon,
/// an interval).
pub fn seconds(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    check_seconds(v, true).map(|()| v).map_err(|why| why.replace("must be", "expected"))
}

/// A duration in seconds above 0, up to a week (a time limit).
pub fn positive_seconds(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    check_seconds(v, false).map(|()| v).map_err(|why| why.replace("must be", "expected"))
}

/// A duration in seconds of at least 1, up to a week (a simulated round: below a
/// second, a day's trace would be millions of rounds).
pub fn round_seconds(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    check_real(v, 1.0, MAX_SECONDS, false)
        .map(|()| v)
        .map_err(|_| format!("expected a number of seconds from 1 to {MAX_SECONDS} (a week), got {}", shown(v)))
}

/// A time on the jobs' clock, in seconds (a round's time, a window of a trace): 0 to
/// [`MAX_CLOCK_SECONDS`], as a job's `submitTimeS` and a trace's times.
pub fn clock_seconds(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    check_real(v, 0.0, MAX_CLOCK_SECONDS, false)
        .map(|()| v)
        .map_err(|_| format!("expected seconds on the jobs' clock, 0 to {MAX_CLOCK_SECONDS:e}, got {}", shown(v)))
}

/// GiB of memory, 0 to [`rubick_core::limits::MAX_MEMORY_GIB`].
pub fn gib(text: &str) -> Result<f64, String> {
    let max = rubick_core::limits::MAX_MEMORY_GIB;
    let v = number(text)?;
    check_real(v, 0.0, max, false).map(|()| v).map_err(|_| format!("expected GiB from 0 to {max}, got {}", shown(v)))
}

/// A share below 1: 0 included, 1 not (a slowdown of 100 % would never finish).
pub fn share_below_one(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    if v.is_finite() && (0.0..1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("expected a share in [0, 1), got {}", shown(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parser_refuses_nan_the_infinities_and_its_out_of_range() {
        type Parser = fn(&str) -> Result<f64, String>;
        let parsers: [(&str, Parser, &[&str], &[&str]); 8] = [
            ("share", share, &["0", "1", "0.5"], &["-0.1", "1.5"]),
            ("ratio", ratio, &["0", "2.5", "1e6"], &["-1", "1e300"]),
            ("seconds", seconds, &["0", "3600", "604800"], &["-1", "604801", "1e300"]),
            ("positive_seconds", positive_seconds, &["0.5", "604800"], &["0", "-1", "1e300"]),
            ("round_seconds", round_seconds, &["1", "60"], &["0.5", "1e-300", "1e300"]),
            ("clock_seconds", clock_seconds, &["0", "1e11"], &["-1", "1e12"]),
            ("gib", gib, &["0", "4"], &["-1", "1e30"]),
            ("share_below_one", share_below_one, &["0", "0.99"], &["1", "-0.1"]),
        ];
        for (name, parse, good, bad) in parsers {
            for text in good {
                assert_eq!(parse(text), Ok(text.parse().unwrap()), "{name} {text}");
            }
            for text in bad.iter().chain(&["nan", "NaN", "inf", "-inf", "infinity", "x", ""]) {
                let why = parse(text).expect_err(&format!("{name} {text}"));
                assert!(why.starts_with("expected"), "{name} {text}: {why}");
            }
        }
    }
}
