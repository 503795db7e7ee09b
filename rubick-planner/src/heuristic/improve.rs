//! The heuristic's second algorithm, after admission: moves while the objective
//! grows, first into free resources, then exchanges that take resources from the jobs
//! of the lowest marginal loss ([`improve`]), with the moves found blocked carried
//! between passes ([`Carry`]).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::ops::Bound;

use super::EPS;
use super::state::State;

/// A move found blocked, with the GPUs it wants and its job holds in the group:
/// while the group's free GPUs and the job's own are too few, it stays blocked (the
/// same test as [`State::fits`]'s, read without looking up either candidate).
#[derive(Clone, Copy)]
pub(super) struct Gate {
    group: usize,
    wants: u32,
    holds: u32,
}

impl Gate {
    pub(super) fn of(st: &State<'_>, m: &Move) -> Gate {
        let cand = st.cand(m.job, m.to);
        let holds = st.choice[m.job].map(|o| st.cand(m.job, o)).filter(|o| o.group == cand.group).map_or(0, |o| o.gpus);
        Gate { group: cand.group, wants: cand.gpus, holds }
    }

    /// `false` when the move cannot fit (as [`State::fits`] would say), `true` when it
    /// may.
    pub(super) fn may_fit(&self, st: &State<'_>) -> bool {
        let mut room = st.free[self.group].gpus;
        room += f64::from(self.holds);
        f64::from(self.wants) <= room + 1e-9
    }

    /// GPUs beyond its own the move needs free.
    pub(super) fn need(&self) -> i64 {
        i64::from(self.wants) - i64::from(self.holds)
    }
}

/// A move's place in a pass: the order moves are tried in (best rate first), then
/// its version (a job's moves of two versions can both be waiting).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Key(Move);

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
pub(super) struct Carry {
    moves: std::collections::BTreeMap<Key, Gate>,
    of_job: Vec<Vec<Key>>,
    needs: Vec<std::collections::BTreeMap<i64, usize>>,
}

impl Carry {
    pub(super) fn new(groups: usize, jobs: usize) -> Self {
        Carry { needs: vec![Default::default(); groups], of_job: vec![Vec::new(); jobs], ..Default::default() }
    }

    /// Adds the moves a pass found blocked (built at once when there are none yet).
    pub(super) fn extend(&mut self, mut fresh: Vec<(Move, Gate)>) {
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

    pub(super) fn remove(&mut self, key: &Key) {
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
    pub(super) fn drop_job(&mut self, j: usize) {
        for key in std::mem::take(&mut self.of_job[j]) {
            self.remove(&key);
        }
    }

    /// Whether some carried move may fit now (its GPUs, by the gate's test).
    pub(super) fn may_any(&self, st: &State<'_>) -> bool {
        self.needs
            .iter()
            .zip(&st.free)
            .any(|(needs, free)| needs.keys().next().is_some_and(|&n| n as f64 <= free.gpus + 0.5))
    }
}

#[derive(Clone, Copy, PartialEq)]
pub(super) struct Move {
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

/// Moves while the objective grows: first whatever fits in the free resources, best
/// marginal gain first; then exchanges that take resources from the jobs with the
/// lowest marginal loss.
///
/// Each pass offers every job's moves from its current choice in one order (best
/// rate first). The moves a pass found blocked come out of it in that order, and a
/// job's moves change only when its choice does, so the next pass merges the blocked
/// list (a cursor) with the moves of the jobs the exchanges changed (a small heap)
/// rather than ranking every job's moves again: the same moves in the same order.
pub(super) fn improve(st: &mut State<'_>) {
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
pub(super) fn passed_before(passed: &Bound<Key>, key: &Key) -> bool {
    match passed {
        Bound::Unbounded => true,
        Bound::Included(p) => p <= key,
        Bound::Excluded(p) => p < key,
    }
}
