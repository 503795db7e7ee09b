//! `rubick-profile compare`: the CI benchmarking gate.
//!
//! Per configuration (plan, placement) of two profiles: the median throughput of each
//! side with its noise, the change, and a one-sided Welch t-test on iteration times.
//! A side's sample is its repetitions' mean iteration times when it has two or more
//! measured runs of the configuration, else its one run's measured iterations (their
//! mean, standard deviation and count, as the table records them). A configuration
//! regresses when its median throughput fell by more than `--max-regression` *and*
//! the test says the slowdown is beyond the noise (p < `--alpha`), or when it measured
//! in the baseline and no longer does (out of memory, failed, timed out).

mod render;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use rubick_core::tables::{PROFILE, ProfileRow, ProfileStatus};
use rubick_io::cli::Outcome;

/// Report formats (their renderers are in [`render`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Markdown,
    /// JUnit XML: one test case per configuration, a failure per regression
    Junit,
}

/// Arguments of `compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// The baseline profile (CSV or Parquet)
    pub baseline: PathBuf,
    /// The new profile
    pub new: PathBuf,
    /// Largest tolerated drop of a configuration's median throughput, e.g. `5%` or `0.05`
    #[arg(long, default_value = "5%", value_parser = parse_fraction)]
    pub max_regression: f64,
    /// Significance level of the one-sided Welch t-test
    #[arg(long, default_value_t = 0.05)]
    pub alpha: f64,
    /// The report's format (stdout)
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    let (number, scale) = match text.strip_suffix('%') {
        Some(n) => (n, 0.01),
        None => (text, 1.0),
    };
    let v: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}`: expected a percentage like 5% or a fraction like 0.05"))?;
    let v = v * scale;
    if !(0.0..1.0).contains(&v) {
        return Err(format!("`{text}`: must be at least 0% and below 100%"));
    }
    Ok(v)
}

/// One side of a configuration: what its measured runs say.
#[derive(Debug, Clone, PartialEq)]
pub struct Side {
    /// Median throughput (samples/s) over the measured runs.
    pub median: f64,
    /// Standard deviation of the throughput (across runs, or within the one run).
    pub spread: f64,
    /// Runs measured and runs that did not measure (with their statuses).
    pub runs: usize,
    pub not_measured: Vec<String>,
    /// The iteration-time sample for the test: mean, variance of the mean, degrees.
    mean_t: f64,
    var_mean_t: f64,
    dof: f64,
}

fn side(rows: &[&ProfileRow]) -> Option<Side> {
    let measured: Vec<&ProfileRow> = rows.iter().copied().filter(|r| r.measured()).collect();
    let not_measured =
        rows.iter().filter(|r| !r.measured()).map(|r| r.status.map_or_else(String::new, |s| s.to_string())).collect();
    let times: Vec<f64> = measured.iter().filter_map(|r| r.iter_time_s).collect();
    if times.is_empty() {
        return (!rows.is_empty()).then_some(Side {
            median: f64::NAN,
            spread: f64::NAN,
            runs: 0,
            not_measured,
            mean_t: f64::NAN,
            var_mean_t: f64::NAN,
            dof: 0.0,
        });
    }
    let throughput: Vec<f64> =
        measured.iter().map(|r| r.samples_per_s.unwrap_or_else(|| 1.0 / r.iter_time_s.unwrap_or(f64::NAN))).collect();
    let n = times.len() as f64;
    let mean_t = times.iter().sum::<f64>() / n;
    let (var_mean_t, dof, spread) = if times.len() >= 2 {
        let var = times.iter().map(|t| (t - mean_t).powi(2)).sum::<f64>() / (n - 1.0);
        let m = throughput.iter().sum::<f64>() / n;
        let sd_thr = (throughput.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
        (var / n, n - 1.0, sd_thr)
    } else {
        let r = measured[0];
        let k = r.iterations.unwrap_or(1).max(1) as f64;
        let sd = r.iter_time_sd_s.unwrap_or(0.0);
        (sd * sd / k, (k - 1.0).max(1.0), throughput[0] * sd / mean_t)
    };
    Some(Side { median: median(&throughput), spread, runs: measured.len(), not_measured, mean_t, var_mean_t, dof })
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The verdict on one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// Faster beyond the threshold and the noise.
    Improved,
    Regressed,
    /// Only in one of the profiles, or measured in neither.
    Incomparable,
}

impl fmt::Display for Verdict {
    /// The verdict as every report writes it: `ok`, `improved`, `REGRESSED`, `n/a`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Ok => "ok",
            Verdict::Improved => "improved",
            Verdict::Regressed => "REGRESSED",
            Verdict::Incomparable => "n/a",
        })
    }
}

/// One configuration compared.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub plan: String,
    pub placement: String,
    pub baseline: Option<Side>,
    pub new: Option<Side>,
    /// New median over baseline median, minus 1.
    pub change: Option<f64>,
    /// One-sided p-value that the new iteration time is longer.
    pub p_slower: Option<f64>,
    pub p_faster: Option<f64>,
    pub verdict: Verdict,
    pub reason: String,
}

/// The report of a comparison: every configuration of either profile, compared.
#[derive(Debug, Clone)]
pub struct Report {
    /// The job both profiles measured (the JUnit test suite).
    pub suite: String,
    /// One per configuration, by plan and placement.
    pub comparisons: Vec<Comparison>,
}

/// Compares two profiles' rows configuration by configuration.
pub fn compare(baseline: &[ProfileRow], new: &[ProfileRow], max_regression: f64, alpha: f64) -> Vec<Comparison> {
    type Sides<'a> = (Vec<&'a ProfileRow>, Vec<&'a ProfileRow>);
    let mut by: BTreeMap<(String, String), Sides<'_>> = BTreeMap::new();
    for r in baseline {
        by.entry((r.plan.clone(), r.placement.clone())).or_default().0.push(r);
    }
    for r in new {
        by.entry((r.plan.clone(), r.placement.clone())).or_default().1.push(r);
    }
    by.into_iter()
        .map(|((plan, placement), (b, n))| {
            let (baseline, new) = (side(&b), side(&n));
            let mut c = Comparison {
                plan,
                placement,
                baseline: baseline.clone(),
                new: new.clone(),
                change: None,
                p_slower: None,
                p_faster: None,
                verdict: Verdict::Incomparable,
                reason: String::new(),
            };
            match (&baseline, &new) {
                (Some(b), Some(n)) if b.runs > 0 && n.runs == 0 => {
                    c.verdict = Verdict::Regressed;
                    c.reason = format!("measured in the baseline, now {}", n.not_measured.join(", "));
                }
                (Some(b), Some(n)) if b.runs > 0 && n.runs > 0 => {
                    let change = n.median / b.median - 1.0;
                    let (p_slower, p_faster) = welch_one_sided(b, n);
                    c.change = Some(change);
                    c.p_slower = Some(p_slower);
                    c.p_faster = Some(p_faster);
                    (c.verdict, c.reason) = if change < -max_regression && p_slower < alpha {
                        (
                            Verdict::Regressed,
                            format!(
                                "throughput {:+.1}% (beyond -{:.1}%), slower beyond the noise (p = {p_slower:.2e} < {alpha})",
                                change * 100.0,
                                max_regression * 100.0
                            ),
                        )
                    } else if change < -max_regression {
                        (Verdict::Ok, format!("throughput {:+.1}% but within the noise (p = {p_slower:.2})", change * 100.0))
                    } else if change > max_regression && p_faster < alpha {
                        (Verdict::Improved, format!("throughput {:+.1}% (p = {p_faster:.2e})", change * 100.0))
                    } else {
                        (Verdict::Ok, format!("throughput {:+.1}%", change * 100.0))
                    };
                }
                (Some(_), Some(_)) => c.reason = "measured in neither profile".into(),
                // A configuration the baseline measured and the new profile lacks is a
                // failure: a CI gate must not pass by measuring less.
                (Some(b), None) if b.runs > 0 => {
                    c.verdict = Verdict::Regressed;
                    c.reason = "measured in the baseline, missing from the new profile".into();
                }
                (Some(_), None) => c.reason = "only in the baseline".into(),
                (None, Some(_)) => c.reason = "only in the new profile".into(),
                (None, None) => {}
            }
            c
        })
        .collect()
}

/// One-sided p-values of Welch's t-test on iteration times: (new is slower, new is faster).
fn welch_one_sided(b: &Side, n: &Side) -> (f64, f64) {
    let se2 = b.var_mean_t + n.var_mean_t;
    let diff = n.mean_t - b.mean_t;
    if se2 <= 0.0 || !se2.is_finite() {
        // No noise measured on either side: any difference is beyond it.
        return match diff.partial_cmp(&0.0) {
            Some(std::cmp::Ordering::Greater) => (0.0, 1.0),
            Some(std::cmp::Ordering::Less) => (1.0, 0.0),
            _ => (1.0, 1.0),
        };
    }
    let t = diff / se2.sqrt();
    let dof = se2.powi(2) / (b.var_mean_t.powi(2) / b.dof.max(1.0) + n.var_mean_t.powi(2) / n.dof.max(1.0));
    let upper = student_t_upper(t, dof.max(1.0));
    (upper, 1.0 - upper)
}

/// P(T > t) for Student's t with `dof` degrees of freedom.
pub fn student_t_upper(t: f64, dof: f64) -> f64 {
    let x = dof / (dof + t * t);
    let tail = 0.5 * regularized_incomplete_beta(x, dof / 2.0, 0.5);
    if t >= 0.0 { tail } else { 1.0 - tail }
}

fn ln_gamma(x: f64) -> f64 {
    // Lanczos approximation (g = 7, n = 9).
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + 7.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// I_x(a, b) by its continued fraction (modified Lentz).
fn regularized_incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - regularized_incomplete_beta(1.0 - x, b, a);
    }
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    d = if d.abs() < tiny { tiny } else { d };
    d = 1.0 / d;
    let mut f = d;
    for m in 1..300 {
        let m = f64::from(m);
        for numerator in [
            m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + numerator * d;
            d = if d.abs() < tiny { tiny } else { d };
            c = 1.0 + numerator / c;
            c = if c.abs() < tiny { tiny } else { c };
            d = 1.0 / d;
            f *= c * d;
        }
        if (c * d - 1.0).abs() < 1e-14 {
            break;
        }
    }
    front * f / a
}

/// Every row names a valid plan and placement, and a measured row a positive, finite
/// time (and sd, and throughput): a verdict from garbage is no verdict. An `ok` row
/// must have its time: a row whose time is empty, infinite or not a number (which
/// read as empty) would otherwise leave its configuration out of the gate. The error
/// names the file, line and column, with the value as the file holds it.
fn check_rows(path: &Path, raw: &RawTimes, rows: &[ProfileRow]) -> anyhow::Result<()> {
    for (i, r) in rows.iter().enumerate() {
        let at = |what: String| anyhow::anyhow!("{}: line {}: {what}", path.display(), i + 2);
        r.plan.parse::<rubick_core::Plan>().map_err(|e| at(format!("plan `{}`: {e}", r.plan)))?;
        r.placement.parse::<rubick_core::Placement>().map_err(|e| at(format!("placement `{}`: {e}", r.placement)))?;
        let ok = r.status == Some(ProfileStatus::Ok);
        if !r.measured() && !ok {
            continue;
        }
        for (column, (name, typed, positive)) in raw.iter().zip([
            ("iter_time_s", r.iter_time_s, true),
            ("samples_per_s", r.samples_per_s, true),
            ("iter_time_sd_s", r.iter_time_sd_s, false),
        ]) {
            let want = if positive { "positive" } else { "non-negative" };
            // The file's value (an infinity or NaN reads as empty in the row).
            let v = column.get(i).copied().flatten().or(typed);
            match v {
                Some(v) if !(v.is_finite() && (v > 0.0 || (!positive && v == 0.0))) => {
                    return Err(at(format!("{name}: expected a {want}, finite number, got {v}")));
                }
                None if name == "iter_time_s" => {
                    return Err(at(
                        "iter_time_s: expected a positive, finite number in a row of status `ok`, got none".to_owned(),
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A profile's time columns as the file holds them (`iter_time_s`, `samples_per_s`,
/// `iter_time_sd_s`; empty where the column is absent), infinities and NaN included.
type RawTimes = [Vec<Option<f64>>; 3];

/// A profile's rows and its raw time columns.
fn read_profile(path: &Path) -> anyhow::Result<(Vec<ProfileRow>, RawTimes)> {
    let df = rubick_io::table::read_typed_table(path, &PROFILE)?;
    let rows: Vec<ProfileRow> = rubick_io::table::rows_of(path, &df, &PROFILE)?;
    let column = |name: &str| -> anyhow::Result<Vec<Option<f64>>> {
        if df.get_column_names().iter().any(|c| c.as_str() == name) {
            Ok(rubick_io::table::f64_column(path, &df, name)?)
        } else {
            Ok(Vec::new())
        }
    };
    let raw = [column("iter_time_s")?, column("samples_per_s")?, column("iter_time_sd_s")?];
    Ok((rows, raw))
}

/// Both tables (and every row of each) measure one job of one model: a comparison of
/// two jobs' times says nothing about either. The error names both.
fn same_job(a_path: &Path, a: &[ProfileRow], b_path: &Path, b: &[ProfileRow]) -> anyhow::Result<()> {
    let Some(first) = a.first().or(b.first()) else { return Ok(()) };
    for (path, rows) in [(a_path, a), (b_path, b)] {
        if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| r.job != first.job || r.model != first.model) {
            anyhow::bail!(
                "{}: line {}: job `{}` (model `{}`), but {} measured job `{}` (model `{}`): compare compares two profiles of one job",
                path.display(),
                i + 2,
                r.job,
                r.model,
                if !a.is_empty() { a_path.display() } else { b_path.display() },
                first.job,
                first.model
            );
        }
    }
    Ok(())
}

/// Runs `compare`: the report on stdout; exit 1 when a configuration regressed.
pub fn run(args: &CompareArgs) -> anyhow::Result<Outcome> {
    rubick_io::cli::ensure_one_stdin(&[&args.baseline, &args.new])?;
    anyhow::ensure!(args.alpha > 0.0 && args.alpha < 1.0, "--alpha: must be between 0 and 1, got {}", args.alpha);
    let (baseline, baseline_raw) = read_profile(&args.baseline)?;
    let (new, new_raw) = read_profile(&args.new)?;
    check_rows(&args.baseline, &baseline_raw, &baseline)?;
    check_rows(&args.new, &new_raw, &new)?;
    same_job(&args.baseline, &baseline, &args.new, &new)?;
    let comparisons = compare(&baseline, &new, args.max_regression, args.alpha);
    anyhow::ensure!(
        comparisons.iter().any(|c| c.change.is_some() || c.verdict == Verdict::Regressed),
        "{} and {}: no configuration measured in both; nothing to compare",
        args.baseline.display(),
        args.new.display()
    );
    let suite = baseline.first().or(new.first()).map_or("profile", |r| r.job.as_str()).to_owned();
    let report = Report { suite, comparisons };
    rubick_io::write_output(
        std::path::Path::new("-"),
        args.format.file_format(),
        args.format.render(&report).as_bytes(),
    )?;
    let regressed: Vec<String> = report
        .comparisons
        .iter()
        .filter(|c| c.verdict == Verdict::Regressed)
        .map(|c| format!("{} on {}: {}", c.plan, c.placement, c.reason))
        .collect();
    if regressed.is_empty() {
        Ok(Outcome::Done)
    } else {
        Ok(Outcome::Negative(format!("{} configuration(s) regressed: {}", regressed.len(), regressed.join("; "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(plan: &str, repeat: i64, t: f64, sd: f64) -> ProfileRow {
        ProfileRow {
            job: "j".into(),
            model: "m".into(),
            plan: plan.into(),
            placement: "1".into(),
            status: Some(ProfileStatus::Ok),
            repeat: Some(repeat),
            iterations: Some(10),
            iter_time_s: Some(t),
            iter_time_sd_s: Some(sd),
            samples_per_s: Some(16.0 / t),
            ..ProfileRow::default()
        }
    }

    #[test]
    fn student_t_tail_matches_tables() {
        // t_{0.975, 10} = 2.228; t_{0.95, 3} = 2.353; symmetric at 0.
        assert!((student_t_upper(2.228, 10.0) - 0.025).abs() < 5e-4);
        assert!((student_t_upper(2.353, 3.0) - 0.05).abs() < 5e-4);
        assert!((student_t_upper(0.0, 7.0) - 0.5).abs() < 1e-12);
        assert!((student_t_upper(-2.228, 10.0) - 0.975).abs() < 5e-4);
    }

    #[test]
    fn a_slowdown_beyond_threshold_and_noise_regresses_and_noise_alone_does_not() {
        let base = [row("a", 0, 1.0, 0.01), row("a", 1, 1.01, 0.01), row("a", 2, 0.99, 0.01)];
        let slow = [row("a", 0, 1.2, 0.01), row("a", 1, 1.21, 0.01), row("a", 2, 1.19, 0.01)];
        let c = compare(&base, &slow, 0.05, 0.05);
        assert_eq!(c[0].verdict, Verdict::Regressed, "{c:?}");
        // Same medians' change but huge noise: within the noise.
        let noisy = [row("a", 0, 0.7, 0.3), row("a", 1, 1.7, 0.3), row("a", 2, 1.2, 0.3)];
        assert_eq!(compare(&base, &noisy, 0.05, 0.05)[0].verdict, Verdict::Ok);
        // Small change: ok even if significant.
        let slightly = [row("a", 0, 1.02, 0.001)];
        assert_eq!(compare(&[row("a", 0, 1.0, 0.001)], &slightly, 0.05, 0.05)[0].verdict, Verdict::Ok);
        // One run each: the iterations' spread is the noise.
        assert_eq!(
            compare(&[row("a", 0, 1.0, 0.01)], &[row("a", 0, 1.3, 0.01)], 0.05, 0.05)[0].verdict,
            Verdict::Regressed
        );
    }

    #[test]
    fn a_configuration_that_no_longer_runs_regresses() {
        let mut oom = row("a", 0, 1.0, 0.0);
        oom.status = Some(ProfileStatus::Oom);
        oom.iter_time_s = None;
        let c = compare(&[row("a", 0, 1.0, 0.01)], &[oom], 0.05, 0.05);
        assert_eq!(c[0].verdict, Verdict::Regressed);
        assert!(c[0].reason.contains("oom"), "{}", c[0].reason);
    }

    #[test]
    fn junit_marks_regressions_as_failures_and_escapes() {
        let c = compare(&[row("a<b", 0, 1.0, 0.01)], &[row("a<b", 0, 1.5, 0.01)], 0.05, 0.05);
        let xml = Format::Junit.render(&Report { suite: "job&1".into(), comparisons: c });
        assert!(xml.contains("failures=\"1\"") && xml.contains("<failure ") && xml.contains("a&lt;b"), "{xml}");
        assert!(xml.contains("job&amp;1") && !xml.contains("job&1"));
    }

    #[test]
    fn percentages_and_fractions_parse() {
        assert_eq!(parse_fraction("5%").unwrap(), 0.05);
        assert_eq!(parse_fraction("0.1").unwrap(), 0.1);
        assert!(parse_fraction("120%").is_err() && parse_fraction("x").is_err());
    }
}
