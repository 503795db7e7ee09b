//! The heuristic's state: each job's choice, what is free, and the index of the jobs
//! that could give resources up (victims by their bound), which `make_room` reads to
//! free what a job's candidate lacks at the least loss of value.

use std::cmp::Ordering;
use std::collections::{BTreeSet, BinaryHeap};

use super::EPS;
use crate::Capacity;
use crate::curves::{Candidate, CurveBook};

/// Victims' new choices, and the value they lose.
pub(super) type Room = (Vec<(usize, Option<usize>)>, f64);

pub(super) struct State<'a> {
    pub(super) book: &'a CurveBook,
    pub(super) choice: Vec<Option<usize>>,
    pub(super) free: Vec<Capacity>,
    pub(super) total: Capacity,
    /// Per node group and per kind of need (the resources it lacks: a [`Kinds`]), the
    /// running jobs there that could give some of them up, by [`State::bound`]:
    /// `make_room` reads victims in this order and stops once no unread job can beat
    /// the offers it has (instead of reading every job).
    pub(super) victims: Vec<[BTreeSet<(u64, usize)>; KINDS]>,
    /// Each job's group and keys in `victims`, where it is there.
    pub(super) keyed: Vec<Option<(usize, [Option<u64>; KINDS])>>,
    /// What each running job could give up ([`State::options`] that free something),
    /// with the value it would lose: kept with its choice, read by every `make_room`.
    pub(super) gives: Vec<Vec<Give>>,
    /// Jobs whose choice changed since they were last indexed ([`State::flush`]).
    pub(super) stale: Vec<bool>,
    pub(super) restale: Vec<usize>,
    /// Rank every victim and every move afresh (the plain algorithm the indexed one
    /// must equal: [`solve_exhaustive`]).
    pub(super) exhaustive: bool,
}

/// The kinds of need: which of GPUs (bit 0), cores (bit 1) and memory (bit 2) it
/// lacks, less one (a need lacking nothing is met); then needs of GPUs alone of at
/// most 1, 2, 4 and 8 GPUs (the common small deficits, whose bounds a victim's whole
/// size would loosen).
pub(super) const KINDS: usize = 7 + SMALL_GPU_NEEDS;
pub(super) const SMALL_GPU_NEEDS: usize = 4;

/// The most of `freed` a need of kind `kind` can use: the resources it lacks (the
/// others zero), at most its GPUs for the small GPU needs.
pub(super) fn ceiling(freed: &Capacity, kind: usize) -> Capacity {
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
pub(super) fn kind_of(need: &Capacity) -> Option<usize> {
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
pub(super) type Give = (Option<usize>, Capacity, f64);

/// An order-preserving key of a float (the order of `f64::total_cmp`).
pub(super) fn float_key(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 { !b } else { b | (1 << 63) }
}

/// The float of a [`float_key`].
pub(super) fn key_float(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// One victim's offer: its rate (loss per useful share freed), the job, its new
/// choice, the value it loses and what it frees.
pub(super) type Offer = (f64, usize, Option<usize>, f64, Capacity);

/// Offers in `make_room`'s order: lowest rate first, ties by lower job.
pub(super) struct ByRate(Offer);

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
    pub(super) fn cand(&self, j: usize, c: usize) -> &'a Candidate {
        &self.book.jobs[j].candidates[c]
    }

    pub(super) fn value(&self, j: usize, c: Option<usize>) -> f64 {
        c.map_or(0.0, |c| self.cand(j, c).value)
    }

    pub(super) fn cost(&self, c: &Candidate) -> f64 {
        f64::from(c.gpus) / self.total.gpus.max(1.0)
            + f64::from(c.cpus) / self.total.cpus.max(1.0)
            + c.host_memory_gib / self.total.mem.max(1.0)
    }

    pub(super) fn cost_of(&self, j: usize, c: Option<usize>) -> f64 {
        c.map_or(0.0, |c| self.cost(self.cand(j, c)))
    }

    /// What job `j` could use in `c`'s group: the free resources and its own there.
    pub(super) fn room_for(&self, j: usize, c: usize) -> Capacity {
        let group = self.cand(j, c).group;
        let mut cap = self.free[group];
        if let Some(old) = self.choice[j].map(|o| self.cand(j, o)).filter(|o| o.group == group) {
            cap.give(old);
        }
        cap
    }

    /// Whether job `j` could switch to `c` with the free resources (its own included).
    pub(super) fn fits(&self, j: usize, c: usize) -> bool {
        self.room_for(j, c).fits(self.cand(j, c))
    }

    pub(super) fn set(&mut self, j: usize, c: Option<usize>) {
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
    pub(super) fn flush(&mut self) {
        for j in std::mem::take(&mut self.restale) {
            self.stale[j] = false;
            self.reindex(j);
        }
    }

    /// Puts job `j` in `victims` by its current choice, with what it could give.
    pub(super) fn reindex(&mut self, j: usize) {
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
    pub(super) fn options(&self, k: usize) -> impl Iterator<Item = (Option<usize>, Capacity)> + '_ {
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
    pub(super) fn bound(&self, k: usize, kind: usize) -> Option<f64> {
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
    pub(super) fn offer(&self, k: usize, need: &Capacity) -> Option<Offer> {
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
    pub(super) fn deficit(&self, j: usize, c: usize) -> Capacity {
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
    pub(super) fn make_room(
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
    pub(super) fn make_room_ranking_all(
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
pub(super) fn useful_share(freed: &Capacity, need: &Capacity, total: &Capacity) -> f64 {
    freed.gpus.min(need.gpus).max(0.0) / total.gpus.max(1.0)
        + freed.cpus.min(need.cpus).max(0.0) / total.cpus.max(1.0)
        + freed.mem.min(need.mem).max(0.0) / total.mem.max(1.0)
}
