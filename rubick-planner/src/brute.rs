//! Exhaustive search over the candidates of a (small) round: the reference the
//! heuristic and the MILP are checked against. Depth-first with capacity pruning and
//! an optimistic bound; exact.

use super::Capacity;
use super::curves::CurveBook;

/// The best objective and a choice reaching it; `None` when no choice gives every
/// guaranteed (and locked) job a candidate within capacity.
pub fn solve(book: &CurveBook) -> Option<(f64, Vec<Option<usize>>)> {
    let n = book.jobs.len();
    // best[j]: the largest value jobs j.. can add, ignoring capacity.
    let mut bound = vec![0.0; n + 1];
    for j in (0..n).rev() {
        let jc = &book.jobs[j];
        let top =
            jc.candidates.iter().map(|c| c.value).fold(if jc.must_run { f64::NEG_INFINITY } else { 0.0 }, f64::max);
        bound[j] = bound[j + 1] + if top.is_finite() { top } else { 0.0 };
    }
    let mut free: Vec<Capacity> = book.capacity.clone();
    let mut choice = vec![None; n];
    let mut best: Option<(f64, Vec<Option<usize>>)> = None;
    dfs(book, 0, 0.0, &bound, &mut free, &mut choice, &mut best);
    best
}

fn dfs(
    book: &CurveBook,
    j: usize,
    value: f64,
    bound: &[f64],
    free: &mut [Capacity],
    choice: &mut [Option<usize>],
    best: &mut Option<(f64, Vec<Option<usize>>)>,
) {
    if let Some((b, _)) = best
        && value + bound[j] <= *b + 1e-12
    {
        return;
    }
    if j == book.jobs.len() {
        *best = Some((value, choice.to_vec()));
        return;
    }
    let jc = &book.jobs[j];
    for (c, cand) in jc.candidates.iter().enumerate() {
        if free[cand.group].fits(cand) {
            free[cand.group].take(cand);
            choice[j] = Some(c);
            dfs(book, j + 1, value + cand.value, bound, free, choice, best);
            choice[j] = None;
            free[cand.group].give(cand);
        }
    }
    if !jc.must_run {
        dfs(book, j + 1, value, bound, free, choice, best);
    }
}
