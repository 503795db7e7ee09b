//! The round as a multiple-choice knapsack, solved exactly by dynamic programming
//! where GPUs are the only resource that can bind.
//!
//! Sia's paper (Jayaram Subramanya et al., SOSP 2023, section 4) observes that its
//! MILP couples jobs only through each GPU type's count. On one node group whose every
//! candidate uses no more cores and host memory than its GPUs' share of the group's
//! (`cpus <= gpus * cores / GPUs`, the same for memory: the goodput peers give every
//! job the node's fair share of cores per GPU), the round is exactly a multiple-choice
//! knapsack over the group's GPUs: each job takes one candidate or none, the chosen
//! GPUs at most the group's, the sum of values maximal. It is solved here over
//! `0..=GPUs` in `O(jobs x GPUs x candidates)` steps, with no time limit and no
//! tolerance: the same book always gives the same choice, whatever the machine's load.
//! Where the condition fails (several groups with candidates, or a candidate heavier
//! in cores or memory than its GPUs' share), [`solve`] answers `None` and the caller
//! solves the MILP.
//!
//! Ties (two choices of the same objective) go to the earlier job keeping less: a job
//! takes a candidate only where it is strictly better, and among a job's candidates the
//! first (fewest GPUs, as books sort them) wins a tie.

use rubick_core::schedule::ExactStatus;
use rubick_planner::CurveBook;
use rubick_planner::exact::{ExactError, ExactSolution};

/// A job's choice at a capacity, in the table: none.
const NONE: u16 = u16::MAX;

/// The book's exact choice when GPUs are the only binding resource of the one group
/// its candidates use; `None` where that does not hold (solve the MILP instead).
/// `Err(Infeasible)` when the jobs that must run cannot all fit.
pub fn solve(book: &CurveBook) -> Option<Result<ExactSolution, ExactError>> {
    let mut group = None;
    for cand in book.jobs.iter().flat_map(|j| &j.candidates) {
        match group {
            None => group = Some(cand.group),
            Some(g) if g != cand.group => return None,
            Some(_) => {}
        }
    }
    let Some(group) = group else {
        // No candidate at all: nothing runs (or a job that must run cannot).
        if book.jobs.iter().any(|j| j.must_run) {
            return Some(Err(ExactError::Infeasible));
        }
        let choice = vec![None; book.jobs.len()];
        return Some(Ok(ExactSolution { choice, objective: 0.0, gap: 0.0, status: ExactStatus::Optimal }));
    };
    let cap = book.capacity.get(group)?;
    if !(cap.gpus >= 0.0 && cap.gpus.is_finite()) || cap.gpus > f64::from(u32::MAX) {
        return None;
    }
    let gpus = (cap.gpus + 1e-9).floor() as usize;
    // Cores and memory bind no sooner than GPUs: each candidate within its GPUs' share.
    let share = |used: f64, total: f64, g: u32| used <= f64::from(g) * (total / cap.gpus.max(1e-12)) + 1e-9;
    let only_gpus_bind =
        book.jobs.iter().flat_map(|j| &j.candidates).all(|c| {
            c.gpus > 0 && share(f64::from(c.cpus), cap.cpus, c.gpus) && share(c.host_memory_gib, cap.mem, c.gpus)
        });
    if !only_gpus_bind || book.jobs.iter().any(|j| j.candidates.len() >= usize::from(NONE)) {
        return None;
    }
    // Capacity beyond what every job's largest candidate together takes is never used.
    let most: usize = book.jobs.iter().map(|j| j.candidates.iter().map(|c| c.gpus as usize).max().unwrap_or(0)).sum();
    let width = gpus.min(most) + 1;
    // best[c]: the largest sum of values of the jobs so far within c GPUs.
    let mut best = vec![0.0f64; width];
    let mut next = vec![0.0f64; width];
    let mut table = vec![NONE; book.jobs.len() * width];
    for (j, jc) in book.jobs.iter().enumerate() {
        let row = &mut table[j * width..(j + 1) * width];
        for c in 0..width {
            let (mut value, mut pick) = if jc.must_run { (f64::NEG_INFINITY, NONE) } else { (best[c], NONE) };
            for (k, cand) in jc.candidates.iter().enumerate() {
                let g = cand.gpus as usize;
                if g > c || best[c - g] == f64::NEG_INFINITY || !cand.value.is_finite() {
                    continue;
                }
                let v = best[c - g] + cand.value;
                if v > value {
                    (value, pick) = (v, k as u16);
                }
            }
            next[c] = value;
            row[c] = pick;
        }
        std::mem::swap(&mut best, &mut next);
    }
    if best[width - 1] == f64::NEG_INFINITY {
        return Some(Err(ExactError::Infeasible));
    }
    // Walk back from the whole capacity.
    let mut choice = vec![None; book.jobs.len()];
    let mut c = width - 1;
    for j in (0..book.jobs.len()).rev() {
        let pick = table[j * width + c];
        if pick != NONE {
            let k = usize::from(pick);
            choice[j] = Some(k);
            c -= book.jobs[j].candidates[k].gpus as usize;
        }
    }
    let objective = rubick_planner::objective(book, &choice);
    Some(Ok(ExactSolution { choice, objective, gap: 0.0, status: ExactStatus::Optimal }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Milp;
    use rubick_core::{Cluster, Placement, Plan};
    use rubick_planner::curves::{Candidate, JobCurves};

    /// splitmix64: a seeded stream of numbers for the random books.
    struct Stream(u64);

    impl Stream {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn candidate(gpus: u32, cpus: u32, mem: f64, value: f64) -> Candidate {
        Candidate {
            group: 0,
            gpus,
            cpus,
            host_memory_gib: mem,
            placement: Placement::packed(gpus, 8).expect("packed"),
            plan: Plan::data_parallel(gpus, 1),
            throughput: value.max(0.0),
            normalized: 1.0,
            value,
            is_current: false,
            is_request: false,
            meets_guarantee: false,
        }
    }

    fn job(name: String, candidates: Vec<Candidate>, must_run: bool) -> JobCurves {
        JobCurves {
            name,
            request_throughput: 1.0,
            guaranteed: false,
            locked: false,
            must_run,
            weight: 1.0,
            candidates,
            current: None,
            refused: None,
            scaled_out: None,
            keep_share: None,
        }
    }

    /// A random round on one group of `nodes` 8-GPU nodes: up to 9 jobs of the goodput
    /// peers' configurations (1, 2, 4, 8, 16 GPUs) with the fair share of cores, real
    /// values (some negative), now and then a job that must run.
    fn random_book(s: &mut Stream, cluster: &mut Cluster) -> CurveBook {
        cluster.node_groups[0].count = 1 + s.below(3) as u32;
        let jobs = 1 + s.below(9) as usize;
        let books = (0..jobs)
            .map(|j| {
                let mut gpus: Vec<u32> = [1, 2, 4, 8, 16].into_iter().filter(|_| s.below(3) > 0).collect();
                gpus.truncate(1 + s.below(5) as usize);
                let cands = gpus.into_iter().map(|g| candidate(g, 12 * g, 100.0 * f64::from(g), 2.5 * s.unit() - 0.5));
                job(format!("j{j}"), cands.collect(), s.below(8) == 0)
            })
            .collect();
        CurveBook::new(books, cluster)
    }

    /// The dynamic programme gives the MILP's optimum on random rounds, and the same
    /// choice (the values are random reals: the optimum is unique), infeasible where
    /// the MILP is. Fails on a DP that forgets a must-run job, takes a candidate past the
    /// capacity, or walks back the wrong table.
    #[test]
    fn the_knapsack_gives_the_milps_choice_on_random_rounds() {
        let mut s = Stream(41);
        let mut cluster = Cluster::example();
        let milp = Milp::new(std::time::Duration::from_secs(30));
        let (mut solved, mut infeasible) = (0, 0);
        for round in 0..400 {
            let book = random_book(&mut s, &mut cluster);
            let dp = solve(&book).expect("one group, cores and memory within the GPUs' share");
            let exact = rubick_planner::exact::ExactSolver::solve(&milp, &book, &cluster, None);
            match (dp, exact) {
                (Ok(dp), Ok(exact)) => {
                    assert!((dp.objective - exact.objective).abs() < 1e-9, "round {round}: {dp:?} vs {exact:?}");
                    assert_eq!(dp.choice, exact.choice, "round {round}");
                    let used: u32 = dp
                        .choice
                        .iter()
                        .enumerate()
                        .filter_map(|(j, c)| c.map(|c| book.jobs[j].candidates[c].gpus))
                        .sum();
                    assert!(f64::from(used) <= book.capacity[0].gpus, "round {round}");
                    solved += 1;
                }
                (Err(ExactError::Infeasible), Err(ExactError::Infeasible)) => infeasible += 1,
                (dp, exact) => panic!("round {round}: {dp:?} vs {exact:?}"),
            }
        }
        assert!(solved > 300 && infeasible > 0, "{solved} solved, {infeasible} infeasible");
    }

    /// Where memory (or a second group) could bind, the knapsack declines.
    #[test]
    fn the_knapsack_declines_where_more_than_gpus_can_bind() {
        let cluster = Cluster::example();
        // 1,600 GiB per 8-GPU node: 200 GiB per GPU; an offloading candidate takes more.
        let heavy = CurveBook::new(vec![job("a".into(), vec![candidate(1, 12, 400.0, 1.0)], false)], &cluster);
        assert!(solve(&heavy).is_none());
        let light = CurveBook::new(vec![job("a".into(), vec![candidate(1, 12, 100.0, 1.0)], false)], &cluster);
        assert_eq!(solve(&light).expect("applies").expect("feasible").choice, vec![Some(0)]);
        let mut two = cluster.clone();
        two.node_groups.push(two.node_groups[0].clone());
        let mut other = candidate(1, 12, 100.0, 1.0);
        other.group = 1;
        let book = CurveBook::new(vec![job("a".into(), vec![candidate(1, 12, 100.0, 1.0), other], false)], &two);
        assert!(solve(&book).is_none());
    }
}
