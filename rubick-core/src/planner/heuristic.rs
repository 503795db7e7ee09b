//! Rubick's heuristic (paper, section 4): guaranteed jobs first with the cheapest
//! configuration that meets their guarantee, then queued jobs with their smallest
//! useful configuration, then resources move from the jobs with the lowest marginal
//! gain to those with the highest while the objective grows.
//!
//! Marginal gain is the change of a job's value (its throughput normalised by that of
//! its request, minus what a restart and the minimum gain cost) per unit of resource,
//! a resource unit being the sum of the shares of the cluster's GPUs, cores and memory
//! a configuration uses. Every accepted move raises the objective by a positive
//! amount, so the loop ends.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::cluster::Cluster;

use super::curves::{Candidate, CurveBook};
use super::{Capacity, JobInput, PlannerConfig, objective};

const EPS: f64 = 1e-9;

/// One candidate index (or none: the job waits) per job, and the objective.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub choice: Vec<Option<usize>>,
    pub objective: f64,
}

/// Guaranteed jobs that cannot all get their guarantee.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}")]
pub struct Infeasible {
    pub jobs: Vec<String>,
    pub reason: String,
}

/// Victims' new choices, and the value they lose.
type Room = (Vec<(usize, Option<usize>)>, f64);

struct State<'a> {
    book: &'a CurveBook,
    choice: Vec<Option<usize>>,
    free: Vec<Capacity>,
    total: Capacity,
}

impl<'a> State<'a> {
    fn cand(&self, j: usize, c: usize) -> &'a Candidate {
        &self.book.jobs[j].candidates[c]
    }

    fn value(&self, j: usize, c: Option<usize>) -> f64 {
        c.map_or(0.0, |c| self.cand(j, c).value)
    }

    fn cost(&self, c: &Candidate) -> f64 {
        f64::from(c.gpus) / self.total.gpus.max(1.0)
            + f64::from(c.cpus) / self.total.cpus.max(1.0)
            + c.host_memory_gib / self.total.mem.max(1.0)
    }

    fn cost_of(&self, j: usize, c: Option<usize>) -> f64 {
        c.map_or(0.0, |c| self.cost(self.cand(j, c)))
    }

    /// What job `j` could use in `c`'s group: the free resources and its own there.
    fn room_for(&self, j: usize, c: usize) -> Capacity {
        let group = self.cand(j, c).group;
        let mut cap = self.free[group];
        if let Some(old) = self.choice[j].map(|o| self.cand(j, o)).filter(|o| o.group == group) {
            cap.give(old);
        }
        cap
    }

    /// Whether job `j` could switch to `c` with the free resources (its own included).
    fn fits(&self, j: usize, c: usize) -> bool {
        self.room_for(j, c).fits(self.cand(j, c))
    }

    fn set(&mut self, j: usize, c: Option<usize>) {
        if let Some(old) = self.choice[j] {
            let old = self.cand(j, old);
            self.free[old.group].give(old);
        }
        if let Some(new) = c {
            let new = self.cand(j, new);
            self.free[new.group].take(new);
        }
        self.choice[j] = c;
    }

    /// What `j` needs in `c`'s group beyond the free resources.
    fn deficit(&self, j: usize, c: usize) -> Capacity {
        let new = self.cand(j, c);
        let cap = self.room_for(j, c);
        Capacity {
            gpus: (f64::from(new.gpus) - cap.gpus).max(0.0),
            cpus: (f64::from(new.cpus) - cap.cpus).max(0.0),
            mem: (new.host_memory_gib - cap.mem).max(0.0),
        }
    }

    /// Frees at least `need` in `group` by shrinking or pausing other jobs (never `j`,
    /// `protect`ed jobs, or below a guarantee), cheapest loss per freed share first.
    /// Returns the victims' new choices and the value lost; nothing is applied.
    fn make_room(&self, j: usize, group: usize, need: Capacity, protect: &dyn Fn(usize) -> bool) -> Option<Room> {
        let mut offers: Vec<(f64, usize, Option<usize>, f64, Capacity)> = Vec::new();
        for (k, jc) in self.book.jobs.iter().enumerate() {
            let Some(cur) = self.choice[k] else { continue };
            if k == j || protect(k) {
                continue;
            }
            let held = self.cand(k, cur);
            if held.group != group {
                continue;
            }
            let mut best: Option<(f64, Option<usize>, f64, Capacity)> = None;
            let options = jc
                .candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| {
                    c.group == group
                        && c.gpus <= held.gpus
                        && c.cpus <= held.cpus
                        && c.host_memory_gib <= held.host_memory_gib
                })
                .map(|(i, _)| Some(i))
                .chain((!jc.must_run).then_some(None));
            for opt in options {
                if opt == Some(cur) {
                    continue;
                }
                let freed = match opt.map(|o| self.cand(k, o)) {
                    Some(c) => Capacity {
                        gpus: f64::from(held.gpus - c.gpus),
                        cpus: f64::from(held.cpus - c.cpus),
                        mem: held.host_memory_gib - c.host_memory_gib,
                    },
                    None => {
                        Capacity { gpus: f64::from(held.gpus), cpus: f64::from(held.cpus), mem: held.host_memory_gib }
                    }
                };
                let useful = useful_share(&freed, &need, &self.total);
                if useful <= EPS {
                    continue;
                }
                let loss = self.value(k, Some(cur)) - self.value(k, opt);
                let rate = loss / useful;
                if best.as_ref().is_none_or(|(r, ..)| rate < *r) {
                    best = Some((rate, opt, loss, freed));
                }
            }
            if let Some((rate, opt, loss, freed)) = best {
                offers.push((rate, k, opt, loss, freed));
            }
        }
        offers.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut left = need;
        let mut moves = Vec::new();
        let mut lost = 0.0;
        for (_, k, opt, loss, freed) in offers {
            if left.gpus <= EPS && left.cpus <= EPS && left.mem <= 1e-6 {
                break;
            }
            if useful_share(&freed, &left, &self.total) <= EPS {
                continue;
            }
            left.gpus -= freed.gpus;
            left.cpus -= freed.cpus;
            left.mem -= freed.mem;
            moves.push((k, opt));
            lost += loss;
        }
        (left.gpus <= EPS && left.cpus <= EPS && left.mem <= 1e-6).then_some((moves, lost))
    }
}

/// Share of the cluster of what `freed` contributes towards `need`.
fn useful_share(freed: &Capacity, need: &Capacity, total: &Capacity) -> f64 {
    freed.gpus.min(need.gpus).max(0.0) / total.gpus.max(1.0)
        + freed.cpus.min(need.cpus).max(0.0) / total.cpus.max(1.0)
        + freed.mem.min(need.mem).max(0.0) / total.mem.max(1.0)
}

#[derive(PartialEq)]
struct Move {
    rate: f64,
    gain: f64,
    job: usize,
    to: usize,
    version: u32,
}

impl Eq for Move {}

impl PartialOrd for Move {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Move {
    /// Highest rate first; ties by lower job index, then lower candidate (determinism).
    fn cmp(&self, other: &Self) -> Ordering {
        self.rate.total_cmp(&other.rate).then(other.job.cmp(&self.job)).then(other.to.cmp(&self.to))
    }
}

/// Runs the heuristic. Fails only when guaranteed jobs cannot all be satisfied.
pub fn solve(
    book: &CurveBook,
    cluster: &Cluster,
    inputs: &[JobInput],
    config: &PlannerConfig,
) -> Result<Decision, Infeasible> {
    let free: Vec<Capacity> = book.capacity.clone();
    let total = cluster.node_groups.iter().map(Capacity::of).fold(Capacity::default(), |a, c| Capacity {
        gpus: a.gpus + c.gpus,
        cpus: a.cpus + c.cpus,
        mem: a.mem + c.mem,
    });
    let n = book.jobs.len();
    let mut st = State { book, choice: vec![None; n], free, total };

    // Running jobs keep their allocation to begin with (locked ones first).
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&j| !book.jobs[j].locked);
    for &j in &order {
        if let Some(cur) = book.jobs[j].current
            && st.fits(j, cur)
        {
            st.set(j, Some(cur));
        }
    }

    // Guaranteed jobs: the cheapest candidate that meets the guarantee, making room
    // by shrinking or pausing non-guaranteed jobs when needed.
    let mut queue: Vec<usize> = (0..n).collect();
    queue.sort_by(|&a, &b| {
        let (ia, ib) = (&inputs[a], &inputs[b]);
        ib.weight(config)
            .total_cmp(&ia.weight(config))
            .then(ia.job.submit_time_s.total_cmp(&ib.job.submit_time_s))
            .then(a.cmp(&b))
    });
    // Only a guarantee may pause a job in its cooldown.
    let guaranteed = |k: usize| book.jobs[k].guaranteed;
    for &j in &queue {
        if !book.jobs[j].guaranteed || st.choice[j].is_some() {
            continue;
        }
        let mut by_cost: Vec<usize> = (0..book.jobs[j].candidates.len()).collect();
        by_cost.sort_by(|&a, &b| st.cost(st.cand(j, a)).total_cmp(&st.cost(st.cand(j, b))).then(a.cmp(&b)));
        let mut placed = false;
        for &c in &by_cost {
            if st.fits(j, c) {
                st.set(j, Some(c));
                placed = true;
                break;
            }
        }
        if !placed {
            for &c in &by_cost {
                let need = st.deficit(j, c);
                if let Some((moves, _)) = st.make_room(j, st.cand(j, c).group, need, &guaranteed) {
                    for (k, opt) in moves {
                        st.set(k, opt);
                    }
                    if st.fits(j, c) {
                        st.set(j, Some(c));
                        placed = true;
                        break;
                    }
                }
            }
        }
        if !placed && !book.jobs[j].must_run {
            continue; // waits in the queue for room for its guarantee
        }
        if !placed {
            let job = &book.jobs[j];
            let reason = if job.candidates.is_empty() {
                format!(
                    "guaranteed job `{}` has no configuration reaching its requested {:.3} samples/s on this cluster",
                    job.name, job.request_throughput
                )
            } else {
                let gpus = job.candidates.iter().map(|c| c.gpus).min().unwrap_or(0);
                format!(
                    "guaranteed job `{}` needs at least {gpus} GPUs for its requested {:.3} samples/s, and the other guaranteed jobs leave too little",
                    job.name, job.request_throughput
                )
            };
            return Err(Infeasible { jobs: vec![job.name.clone()], reason });
        }
    }

    // Starving jobs, oldest first: their cheapest useful candidate, making room
    // from younger, non-guaranteed jobs outside their cooldown. Everyone else is
    // admitted by marginal gain below.
    for &j in &queue {
        if st.choice[j].is_some() || book.jobs[j].candidates.is_empty() || !inputs[j].starving(config) {
            continue;
        }
        let jc = &book.jobs[j];
        let cheapest = (0..jc.candidates.len())
            .filter(|&c| jc.candidates[c].value > EPS)
            .min_by(|&a, &b| st.cost(st.cand(j, a)).total_cmp(&st.cost(st.cand(j, b))).then(a.cmp(&b)));
        let Some(c) = cheapest else { continue };
        if st.fits(j, c) {
            st.set(j, Some(c));
        } else {
            let need = st.deficit(j, c);
            let protect = |k: usize| book.jobs[k].guaranteed || book.jobs[k].locked || inputs[k].starving(config);
            if let Some((moves, lost)) = st.make_room(j, st.cand(j, c).group, need, &protect)
                && lost < st.cand(j, c).value
            {
                for (k, opt) in moves {
                    st.set(k, opt);
                }
                st.set(j, Some(c));
            }
        }
    }

    improve(&mut st);
    if let Some(j) = (0..n).find(|&j| book.jobs[j].must_run && st.choice[j].is_none()) {
        let name = book.jobs[j].name.clone();
        return Err(Infeasible {
            reason: format!("job `{name}` is in its cooldown but its current allocation no longer fits"),
            jobs: vec![name],
        });
    }
    let objective = objective(book, &st.choice);
    Ok(Decision { choice: st.choice, objective })
}

/// Moves while the objective grows: first whatever fits in the free resources, best
/// marginal gain first; then exchanges that take resources from the jobs with the
/// lowest marginal loss.
fn improve(st: &mut State<'_>) {
    let n = st.book.jobs.len();
    let mut version = vec![0u32; n];
    let push_moves = |st: &State<'_>, heap: &mut BinaryHeap<Move>, j: usize, version: u32| {
        let jc = &st.book.jobs[j];
        if jc.locked {
            return;
        }
        let cur = st.choice[j];
        let (v0, c0) = (st.value(j, cur), st.cost_of(j, cur));
        for (to, cand) in jc.candidates.iter().enumerate() {
            if Some(to) == cur {
                continue;
            }
            let gain = cand.value - v0;
            if gain <= EPS {
                continue;
            }
            let dcost = st.cost(cand) - c0;
            let rate = if dcost <= EPS { 1e12 + gain } else { gain / dcost };
            heap.push(Move { rate, gain, job: j, to, version });
        }
    };
    let mut rounds = 0;
    loop {
        rounds += 1;
        let mut heap = BinaryHeap::new();
        for (j, &v) in version.iter().enumerate() {
            push_moves(st, &mut heap, j, v);
        }
        let mut blocked = Vec::new();
        while let Some(m) = heap.pop() {
            if m.version != version[m.job] {
                continue;
            }
            if st.fits(m.job, m.to) {
                st.set(m.job, Some(m.to));
                version[m.job] += 1;
                push_moves(st, &mut heap, m.job, version[m.job]);
            } else {
                blocked.push(m);
            }
        }
        // Exchanges, best rate first; a few dozen tries per pass.
        let mut exchanged = false;
        for m in blocked.iter().take(64) {
            if m.version != version[m.job] {
                continue;
            }
            let group = st.cand(m.job, m.to).group;
            let need = st.deficit(m.job, m.to);
            let locked = |k: usize| st.book.jobs[k].locked;
            let Some((moves, lost)) = st.make_room(m.job, group, need, &locked) else { continue };
            if m.gain - lost <= EPS {
                continue;
            }
            let before = st.choice.clone();
            let old_free = st.free.clone();
            for &(k, opt) in &moves {
                st.set(k, opt);
            }
            if st.fits(m.job, m.to) {
                st.set(m.job, Some(m.to));
                for &(k, _) in &moves {
                    version[k] += 1;
                }
                version[m.job] += 1;
                exchanged = true;
            } else {
                st.choice = before;
                st.free = old_free;
            }
        }
        if !exchanged || rounds >= 50 {
            break;
        }
    }
}
