//! Which algorithm runs a collective: the per-call or communicator override, else the cost
//! model's choice, kept per problem so that a loop of calls evaluates the model once.
use super::Comm;
use crate::algo::{self, Algorithm, Collective, Options, Problem};
use crate::config::Forced;
use crate::error::{Error, Result};
use std::sync::atomic::Ordering;

/// What a choice depends on besides the model: the problem, the element size and the forced
/// algorithm (None: `auto`).
pub(super) type ChoiceKey = (Problem, usize, Option<Algorithm>);

/// How many choices a communicator keeps (a new one beyond that clears them).
const CHOICES_KEPT: usize = 1024;

impl Comm {
    /// Which algorithm runs `p` (override, else the cost model), with its options.
    pub fn choose(
        &self,
        p: &Problem,
        elem: usize,
        per_call: Option<Algorithm>,
    ) -> Result<(Algorithm, Options)> {
        let forced = self.forced_for(p.coll, per_call);
        let key = (*p, elem, forced);
        if let Some(c) = self.choices.lock().get(&key) {
            return Ok(*c);
        }
        let c = self.decide(p, elem, forced)?;
        let mut choices = self.choices.lock();
        if choices.len() >= CHOICES_KEPT {
            choices.clear();
        }
        choices.insert(key, c);
        Ok(c)
    }

    /// The algorithm forced on `coll` (None: `auto`): the per-call one, else the
    /// communicator's. `FABRICOLL_ALGO`'s plain form yields `auto` for a collective it does
    /// not implement, with one warning per collective; a forced one that does not implement
    /// it is `decide`'s error.
    pub(super) fn forced_for(
        &self,
        coll: Collective,
        per_call: Option<Algorithm>,
    ) -> Option<Algorithm> {
        if per_call.is_some() {
            return per_call;
        }
        let setting = *self.algo.lock();
        match setting.of(coll) {
            Forced::Auto => None,
            Forced::Explicit(a) => Some(a),
            Forced::Plain(a) if algo::supports(a, coll) => Some(a),
            Forced::Plain(a) => {
                let bit = 1u8 << (coll as usize);
                if self.algo_warned.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                    log::warn!(
                        "FABRICOLL_ALGO={a} does not implement {coll:?}: it runs auto (name it, as in {}:ring, to force one)",
                        format!("{coll:?}").to_lowercase()
                    );
                }
                None
            }
        }
    }

    /// `choose` without the kept choices.
    fn decide(
        &self,
        p: &Problem,
        elem: usize,
        forced: Option<Algorithm>,
    ) -> Result<(Algorithm, Options)> {
        let opts = Options {
            slice: (self.slice / elem.max(1)).max(1),
            hosts: self.hosts,
            intra: Algorithm::Ring,
            inter: Algorithm::Ring,
        };
        if let Some(a) = forced {
            if !algo::supports(a, p.coll) {
                let ok: Vec<&str> = Algorithm::ALL
                    .iter()
                    .filter(|x| algo::supports(**x, p.coll))
                    .map(|x| x.name())
                    .collect();
                return Err(Error::InvalidArgument(format!(
                    "algorithm '{a}' does not implement {:?}; accepted values: auto, {}",
                    p.coll,
                    ok.join(", ")
                )));
            }
            // A forced hier or swizzle runs with the levels the model prices best on these
            // hosts (ring x ring on one host, where the levels do not matter).
            let opts = if matches!(a, Algorithm::Hier | Algorithm::Swizzle) {
                self.model.levels_for(a, p, elem, opts)
            } else {
                self.model.eager_slicing(a, p, elem, opts)
            };
            return Ok((a, opts));
        }
        Ok(self.model.choose(p, elem, opts))
    }
}
