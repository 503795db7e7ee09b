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
use std::collections::{BTreeSet, BinaryHeap};
use std::ops::Bound;

use rubick_core::cluster::Cluster;

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
    /// Per node group and per kind of need (the resources it lacks: a [`Kinds`]), the
    /// running jobs there that could give some of them up, by [`State::bound`]:
    /// `make_room` reads victims in this order and stops once no unread job can beat
    /// the offers it has (instead of reading every job).
    victims: Vec<[BTreeSet<(u64, usize)>; KINDS]>,
    /// Each job's group and keys in `victims`, where it is there.
    keyed: Vec<Option<(usize, [Option<u64>; KINDS])>>,
    /// What each running job could give up ([`State::options`] that free something),
    /// with the value it would lose: kept with its choice, read by every `make_room`.
    gives: Vec<Vec<Give>>,
    /// Jobs whose choice changed since they were last indexed ([`State::flush`]).
    stale: Vec<bool>,
    restale: Vec<usize>,
    /// Rank every victim and every move afresh (the plain algorithm the indexed one
    /// must equal: [`solve_exhaustive`]).
    exhaustive: bool,
}

/// The kinds of need: which of GPUs (bit 0), cores (bit 1) and memory (bit 2) it
/// lacks, less one (a need lacking nothing is met); then needs of GPUs alone of at
/// most 1, 2, 4 and 8 GPUs (the common small deficits, whose bounds a victim's whole
/// size would loosen).
const KINDS: usize = 7 + SMALL_GPU_NEEDS;
const SMALL_GPU_NEEDS: usize = 4;

/// The most of `freed` a need of kind `kind` can use: the resources it lacks (the
/// others zero), at most its GPUs for the small GPU needs.
fn ceiling(freed: &Capacity, kind: usize) -> Capacity {
    if kind >= 7 {
        return Capacity { gpus: f64::from(1u32 << (kind - 7)), cpus: 0.0, mem: 0.0 };
    }
    let bits = kind + 1;
    Capacity {
        gpus: if bits & 1 != 0 { freed.gpus } else { 0.0 },
        cpus: if bits & 2 != 0 { freed.cpus } else { 0.0 },
        mem: if bits & 4 != 0 { freed.mem } else { 0.0 },
    }
}

/// The kind of a need (`None` when it lacks nothing).
fn kind_of(need: &Capacity) -> Option<usize> {
    let bits = usize::from(need.gpus > 0.0) | usize::from(need.cpus > 0.0) << 1 | usize::from(need.mem > 0.0) << 2;
    let kind = bits.checked_sub(1)?;
    if kind == 0 {
        // GPUs alone: the smallest ceiling at least the need.
        if let Some(level) = (0..SMALL_GPU_NEEDS).find(|&l| need.gpus <= f64::from(1u32 << l)) {
            return Some(7 + level);
        }
    }
    Some(kind)
}

/// A choice a victim could take instead of its own (or pause), what that frees, and
/// the value it loses.
type Give = (Option<usize>, Capacity, f64);

/// An order-preserving key of a float (the order of `f64::total_cmp`).
fn float_key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 { !b } else { b | (1 << 63) }
}

/// The float of a [`float_key`].
fn key_float(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// One victim's offer: its rate (loss per useful share freed), the job, its new
/// choice, the value it loses and what it frees.
type Offer = (f64, usize, Option<usize>, f64, Capacity);

/// Offers in `make_room`'s order: lowest rate first, ties by lower job.
struct ByRate(Offer);

impl PartialEq for ByRate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for ByRate {}

impl PartialOrd for ByRate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByRate {
    /// Reversed: `BinaryHeap` pops the lowest rate (then the lowest job) first.
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.0.total_cmp(&self.0.0).then(other.0.1.cmp(&self.0.1))
    }
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
        if !self.stale[j] {
            self.stale[j] = true;
            self.restale.push(j);
        }
    }

    /// Re-indexes the jobs whose choice changed since the last time (once each, however
    /// often they changed): `make_room` reads the indexes, nothing else does.
    fn flush(&mut self) {
        for j in std::mem::take(&mut self.restale) {
            self.stale[j] = false;
            self.reindex(j);
        }
    }

    /// Puts job `j` in `victims` by its current choice, with what it could give.
    fn reindex(&mut self, j: usize) {
        if let Some((group, keys)) = self.keyed[j].take() {
            for (kind, key) in keys.iter().enumerate() {
                if let Some(key) = key {
                    self.victims[group][kind].remove(&(*key, j));
                }
            }
        }
        let mut gives = std::mem::take(&mut self.gives[j]);
        gives.clear();
        let v0 = self.value(j, self.choice[j]);
        gives.extend(
            self.options(j)
                .filter(|(_, freed)| useful_share(freed, freed, &self.total) > EPS)
                .map(|(opt, freed)| (opt, freed, v0 - self.value(j, opt))),
        );
        self.gives[j] = gives;
        let Some(c) = self.choice[j] else { return };
        let group = self.cand(j, c).group;
        let mut keys = [None; KINDS];
        for (kind, slot) in keys.iter_mut().enumerate() {
            if let Some(bound) = self.bound(j, kind) {
                let key = float_key(bound);
                self.victims[group][kind].insert((key, j));
                *slot = Some(key);
            }
        }
        self.keyed[j] = Some((group, keys));
    }

    /// What job `k` could give up from its current choice: its choices in the same
    /// group using no more of anything, and pausing unless it must run.
    fn options(&self, k: usize) -> impl Iterator<Item = (Option<usize>, Capacity)> + '_ {
        let jc = &self.book.jobs[k];
        let cur = self.choice[k];
        let held = cur.map(|c| self.cand(k, c));
        held.into_iter().flat_map(move |held| {
            jc.candidates
                .iter()
                .enumerate()
                .filter(move |&(i, c)| {
                    Some(i) != cur
                        && c.group == held.group
                        && c.gpus <= held.gpus
                        && c.cpus <= held.cpus
                        && c.host_memory_gib <= held.host_memory_gib
                })
                .map(move |(i, c)| {
                    let freed = Capacity {
                        gpus: f64::from(held.gpus - c.gpus),
                        cpus: f64::from(held.cpus - c.cpus),
                        mem: held.host_memory_gib - c.host_memory_gib,
                    };
                    (Some(i), freed)
                })
                .chain((!jc.must_run).then(|| {
                    (
                        None,
                        Capacity { gpus: f64::from(held.gpus), cpus: f64::from(held.cpus), mem: held.host_memory_gib },
                    )
                }))
        })
    }

    /// A lower bound of job `k`'s rate in any `make_room` for a need of kind `kind`:
    /// its loss per share of the cluster freed of the resources the need lacks (up to
    /// the kind's ceiling), counting all of that as useful (the need can only make
    /// less of it useful). `None` when it has none of them to give.
    fn bound(&self, k: usize, kind: usize) -> Option<f64> {
        let mut best: Option<f64> = None;
        for (_, freed, loss) in &self.gives[k] {
            let share = useful_share(freed, &ceiling(freed, kind), &self.total);
            if share <= EPS {
                continue; // useful to no need of this kind
            }
            // A gain (negative loss) is divided by less where less is useful: no bound.
            let rate = if *loss < 0.0 || loss.is_nan() { f64::NEG_INFINITY } else { loss / share };
            if best.is_none_or(|b| rate < b) {
                best = Some(rate);
            }
        }
        best
    }

    /// Job `k`'s best offer towards `need`, as `make_room` ranks them.
    fn offer(&self, k: usize, need: &Capacity) -> Option<Offer> {
        self.choice[k]?;
        let mut best: Option<(f64, Option<usize>, f64, Capacity)> = None;
        for &(opt, freed, loss) in &self.gives[k] {
            let useful = useful_share(&freed, need, &self.total);
            if useful <= EPS {
                continue;
            }
            let rate = loss / useful;
            if best.as_ref().is_none_or(|(r, ..)| rate < *r) {
                best = Some((rate, opt, loss, freed));
            }
        }
        best.map(|(rate, opt, loss, freed)| (rate, k, opt, loss, freed))
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
    ///
    /// Victims are read in the order of their bound for the need's kind, and an
    /// offer is taken once no unread job's bound reaches its rate: the same offers in
    /// the same order as ranking every job's, without reading every job (a job absent
    /// from the kind's index has nothing the need lacks). Gives up (`None`) once the
    /// loss is sure to exceed `budget` (by more than rounding could explain): every
    /// later offer costs at least the lowest rate left per share of what is left.
    fn make_room(
        &self,
        j: usize,
        group: usize,
        need: Capacity,
        protect: &dyn Fn(usize) -> bool,
        budget: f64,
    ) -> Option<Room> {
        let covered = |left: &Capacity| left.gpus <= EPS && left.cpus <= EPS && left.mem <= 1e-6;
        if self.exhaustive {
            return self.make_room_ranking_all(j, group, need, protect);
        }
        let Some(kind) = kind_of(&need).filter(|_| !covered(&need)) else {
            return covered(&need).then(|| (Vec::new(), 0.0));
        };
        let mut unread = self.victims[group][kind].iter().filter(|&&(_, k)| k != j && !protect(k)).peekable();
        let mut offers: BinaryHeap<ByRate> = BinaryHeap::new();
        let mut left = need;
        let mut moves = Vec::new();
        let mut lost = 0.0;
        while !covered(&left) {
            let next_bound = unread.peek().map(|&&(key, _)| key);
            let lowest = match (offers.peek(), next_bound) {
                (Some(o), Some(b)) => o.0.0.min(key_float(b)),
                (Some(o), None) => o.0.0,
                (None, Some(b)) => key_float(b),
                (None, None) => break,
            };
            if lowest >= 0.0 && lost + lowest * useful_share(&left, &left, &self.total) > budget + 1e-6 {
                return None;
            }
            let take = offers.peek().is_some_and(|o| next_bound.is_none_or(|b| float_key(o.0.0) < b));
            if take {
                let Some(ByRate((_, k, opt, loss, freed))) = offers.pop() else { break };
                if useful_share(&freed, &left, &self.total) <= EPS {
                    continue;
                }
                left.gpus -= freed.gpus;
                left.cpus -= freed.cpus;
                left.mem -= freed.mem;
                moves.push((k, opt));
                lost += loss;
            } else {
                let Some(&(_, k)) = unread.next() else { break };
                if let Some(offer) = self.offer(k, &need) {
                    offers.push(ByRate(offer));
                }
            }
        }
        covered(&left).then_some((moves, lost))
    }

    /// [`State::make_room`] as first written: every running job's offer in the group,
    /// ranked, taken in order until the need is met.
    fn make_room_ranking_all(
        &self,
        j: usize,
        group: usize,
        need: Capacity,
        protect: &dyn Fn(usize) -> bool,
    ) -> Option<Room> {
        let mut offers: Vec<Offer> = (0..self.book.jobs.len())
            .filter(|&k| k != j && !protect(k))
            .filter(|&k| self.choice[k].is_some_and(|c| self.cand(k, c).group == group))
            .filter_map(|k| self.offer(k, &need))
            .collect();
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

/// A move found blocked, with the GPUs it wants and its job holds in the group:
/// while the group's free GPUs and the job's own are too few, it stays blocked (the
/// same test as [`State::fits`]'s, read without looking up either candidate).
#[derive(Clone, Copy)]
struct Gate {
    group: usize,
    wants: u32,
    holds: u32,
}

impl Gate {
    fn of(st: &State<'_>, m: &Move) -> Gate {
        let cand = st.cand(m.job, m.to);
        let holds = st.choice[m.job].map(|o| st.cand(m.job, o)).filter(|o| o.group == cand.group).map_or(0, |o| o.gpus);
        Gate { group: cand.group, wants: cand.gpus, holds }
    }

    /// `false` when the move cannot fit (as [`State::fits`] would say), `true` when it
    /// may.
    fn may_fit(&self, st: &State<'_>) -> bool {
        let mut room = st.free[self.group].gpus;
        room += f64::from(self.holds);
        f64::from(self.wants) <= room + 1e-9
    }

    /// GPUs beyond its own the move needs free.
    fn need(&self) -> i64 {
        i64::from(self.wants) - i64::from(self.holds)
    }
}

/// A move's place in a pass: the order moves are tried in (best rate first), then
/// its version (a job's moves of two versions can both be waiting).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Key(Move);

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        other.0.cmp(&self.0).then(self.0.version.cmp(&other.0.version))
    }
}

/// The moves found blocked, carried from pass to pass in the order they are tried,
/// each with its gate; a job's are dropped when it changes (they are stale). Per
/// group, the least GPUs any of them needs beyond its own: while every group has
/// fewer free (by more than rounding), no carried move can fit and a pass passes
/// them without reading them.
#[derive(Default)]
struct Carry {
    moves: std::collections::BTreeMap<Key, Gate>,
    of_job: Vec<Vec<Key>>,
    needs: Vec<std::collections::BTreeMap<i64, usize>>,
}

impl Carry {
    fn new(groups: usize, jobs: usize) -> Self {
        Carry { needs: vec![Default::default(); groups], of_job: vec![Vec::new(); jobs], ..Default::default() }
    }

    /// Adds the moves a pass found blocked (built at once when there are none yet).
    fn extend(&mut self, mut fresh: Vec<(Move, Gate)>) {
        fresh.sort_by_key(|&(m, _)| Key(m));
        for &(m, gate) in &fresh {
            self.of_job[m.job].push(Key(m));
            *self.needs[gate.group].entry(gate.need()).or_default() += 1;
        }
        if self.moves.is_empty() {
            self.moves = fresh.into_iter().map(|(m, g)| (Key(m), g)).collect();
        } else {
            self.moves.extend(fresh.into_iter().map(|(m, g)| (Key(m), g)));
        }
    }

    fn remove(&mut self, key: &Key) {
        if let Some(gate) = self.moves.remove(key) {
            let needs = &mut self.needs[gate.group];
            if let Some(n) = needs.get_mut(&gate.need()) {
                *n -= 1;
                if *n == 0 {
                    needs.remove(&gate.need());
                }
            }
        }
    }

    /// Drops job `j`'s moves (it changed).
    fn drop_job(&mut self, j: usize) {
        for key in std::mem::take(&mut self.of_job[j]) {
            self.remove(&key);
        }
    }

    /// Whether some carried move may fit now (its GPUs, by the gate's test).
    fn may_any(&self, st: &State<'_>) -> bool {
        self.needs
            .iter()
            .zip(&st.free)
            .any(|(needs, free)| needs.keys().next().is_some_and(|&n| n as f64 <= free.gpus + 0.5))
    }
}

#[derive(Clone, Copy, PartialEq)]
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
    solve_with(book, cluster, inputs, config, false)
}

/// [`solve`] without its indexes: every victim's offer ranked in each `make_room`,
/// every job's moves ranked afresh in each pass of the improvement. Slower (about
/// quadratic), and the same decision bit for bit: the reference the tests hold
/// [`solve`] to.
pub fn solve_exhaustive(
    book: &CurveBook,
    cluster: &Cluster,
    inputs: &[JobInput],
    config: &PlannerConfig,
) -> Result<Decision, Infeasible> {
    solve_with(book, cluster, inputs, config, true)
}

fn solve_with(
    book: &CurveBook,
    cluster: &Cluster,
    inputs: &[JobInput],
    config: &PlannerConfig,
    exhaustive: bool,
) -> Result<Decision, Infeasible> {
    let free: Vec<Capacity> = book.capacity.clone();
    let total = cluster.node_groups.iter().map(Capacity::of).fold(Capacity::default(), |a, c| Capacity {
        gpus: a.gpus + c.gpus,
        cpus: a.cpus + c.cpus,
        mem: a.mem + c.mem,
    });
    let n = book.jobs.len();
    let victims = (0..book.capacity.len()).map(|_| std::array::from_fn(|_| BTreeSet::new())).collect();
    let mut st = State {
        book,
        choice: vec![None; n],
        free,
        total,
        victims,
        keyed: vec![None; n],
        gives: vec![Vec::new(); n],
        stale: vec![false; n],
        restale: Vec::new(),
        exhaustive,
    };

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
                st.flush();
                if let Some((moves, _)) = st.make_room(j, st.cand(j, c).group, need, &guaranteed, f64::INFINITY) {
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
            st.flush();
            if let Some((moves, lost)) = st.make_room(j, st.cand(j, c).group, need, &protect, st.cand(j, c).value)
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
///
/// Each pass offers every job's moves from its current choice in one order (best
/// rate first). The moves a pass found blocked come out of it in that order, and a
/// job's moves change only when its choice does, so the next pass merges the blocked
/// list (a cursor) with the moves of the jobs the exchanges changed (a small heap)
/// rather than ranking every job's moves again: the same moves in the same order.
fn improve(st: &mut State<'_>) {
    let n = st.book.jobs.len();
    let mut version = vec![0u32; n];
    let moves_of = |st: &State<'_>, j: usize, version: u32, out: &mut dyn FnMut(Move)| {
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
            out(Move { rate, gain, job: j, to, version });
        }
    };
    let push_moves = |st: &State<'_>, heap: &mut BinaryHeap<Move>, j: usize, version: u32| {
        moves_of(st, j, version, &mut |m| heap.push(m));
    };
    // Every job's first moves, sorted once (the first pass reads them in order beside
    // the heap of the moves jobs make next).
    let mut first: Vec<Move> = Vec::new();
    for j in 0..n {
        moves_of(st, j, 0, &mut |m| first.push(m));
    }
    first.sort_unstable_by(|a, b| b.cmp(a));
    let mut first = first.into_iter().peekable();
    let mut heap = BinaryHeap::new();
    // The moves the last passes found blocked (none in an exhaustive pass).
    let mut carry = Carry::new(st.free.len(), n);
    let mut rounds = 0;
    loop {
        rounds += 1;
        // The first blocked moves, in the order they came: the exchanges' candidates.
        let mut blocked = Vec::with_capacity(64);
        // Moves from the heap found blocked: carried once the pass is over.
        let mut fresh: Vec<(Move, Gate)> = Vec::new();
        // Carried moves before this were passed in this pass.
        let mut passed: Bound<Key> = Bound::Unbounded;
        loop {
            let top = match (heap.peek(), first.peek()) {
                (Some(h), Some(f)) => Some(if f > h { *f } else { *h }),
                (h, f) => h.or(f).copied(),
            }
            .map(Key);
            let next = carry.moves.range((passed, Bound::Unbounded)).next().map(|(k, g)| (*k, *g));
            let from_carry = match (top, next) {
                (None, None) => break,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some(t), Some((c, _))) => c < t,
            };
            if from_carry {
                let Some((key, gate)) = next else { break };
                if !carry.may_any(st) {
                    // None of them fits: pass every carried move before the heap's next
                    // (noting the first ones as blocked) without reading them.
                    let upto = top.map_or(Bound::Unbounded, Bound::Excluded);
                    if blocked.len() < 64 {
                        let room = 64 - blocked.len();
                        blocked.extend(carry.moves.range((passed, upto)).take(room).map(|(k, _)| k.0));
                    }
                    match top {
                        Some(t) => passed = Bound::Included(t),
                        None => break,
                    }
                    continue;
                }
                passed = Bound::Excluded(key);
                let m = key.0;
                if gate.may_fit(st) && st.fits(m.job, m.to) {
                    st.set(m.job, Some(m.to));
                    version[m.job] += 1;
                    carry.drop_job(m.job);
                    push_moves(st, &mut heap, m.job, version[m.job]);
                } else if blocked.len() < 64 {
                    blocked.push(m);
                }
            } else {
                let m = if first.peek().is_some_and(|f| heap.peek().is_none_or(|h| f > h)) {
                    first.next()
                } else {
                    heap.pop()
                };
                let Some(m) = m else { break };
                if m.version != version[m.job] {
                    continue;
                }
                if st.fits(m.job, m.to) {
                    st.set(m.job, Some(m.to));
                    version[m.job] += 1;
                    carry.drop_job(m.job);
                    push_moves(st, &mut heap, m.job, version[m.job]);
                    continue;
                }
                if blocked.len() < 64 {
                    blocked.push(m);
                }
                if !st.exhaustive {
                    fresh.push((m, Gate::of(st, &m)));
                }
                // In order: nothing carried lies between; one that ranks above what was
                // passed (a job's next moves) waits for the next pass.
                if passed_before(&passed, &Key(m)) {
                    passed = Bound::Excluded(Key(m));
                }
            }
        }
        // Exchanges, best rate first; a few dozen tries per pass.
        let mut exchanged = false;
        let mut changed = Vec::new();
        for m in &blocked {
            if m.version != version[m.job] {
                continue;
            }
            let group = st.cand(m.job, m.to).group;
            let need = st.deficit(m.job, m.to);
            let locked = |k: usize| st.book.jobs[k].locked;
            st.flush();
            let Some((moves, lost)) = st.make_room(m.job, group, need, &locked, m.gain) else { continue };
            if m.gain - lost <= EPS {
                continue;
            }
            // Only the victims change: what they held, and the free resources, are
            // all there is to restore.
            let before: Vec<(usize, Option<usize>)> = moves.iter().map(|&(k, _)| (k, st.choice[k])).collect();
            let old_free = st.free.clone();
            for &(k, opt) in &moves {
                st.set(k, opt);
            }
            if st.fits(m.job, m.to) {
                st.set(m.job, Some(m.to));
                for &(k, _) in &moves {
                    version[k] += 1;
                    changed.push(k);
                }
                version[m.job] += 1;
                changed.push(m.job);
                exchanged = true;
                for &(k, _) in &moves {
                    carry.drop_job(k);
                }
                carry.drop_job(m.job);
            } else {
                // In reverse: a job named twice gets back what it held first.
                for &(k, held) in before.iter().rev() {
                    st.choice[k] = held;
                }
                st.free = old_free;
                for &(k, _) in &moves {
                    if !st.stale[k] {
                        st.stale[k] = true;
                        st.restale.push(k);
                    }
                }
            }
        }
        if !exchanged || rounds >= 50 {
            break;
        }
        fresh.retain(|(m, _)| m.version == version[m.job]);
        carry.extend(fresh);
        if st.exhaustive {
            for (j, &v) in version.iter().enumerate() {
                push_moves(st, &mut heap, j, v);
            }
            continue;
        }
        changed.sort_unstable();
        changed.dedup();
        for j in changed {
            push_moves(st, &mut heap, j, version[j]);
        }
    }
}

/// Whether `key` comes after what `passed` bounds (it is next in order).
fn passed_before(passed: &Bound<Key>, key: &Key) -> bool {
    match passed {
        Bound::Unbounded => true,
        Bound::Included(p) => p <= key,
        Bound::Excluded(p) => p < key,
    }
}
