//! Which algorithm runs a collective: the per-call or communicator override, else the cost
//! model's choice, kept per problem so that a loop of calls evaluates the model once.
use super::Comm;
use crate::algo::{self, Algorithm, Options, Problem};
use crate::error::{Error, Result};

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
        let forced = per_call.or(*self.algo.lock());
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
