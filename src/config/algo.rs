//! `FABRICOLL_ALGO`: one algorithm for every collective (`ring`), or one per collective as
//! NCCL's `NCCL_ALGO` takes them (`allreduce:ring;allgather:bruck`).
use crate::algo::{self, Algorithm, Collective};
use crate::error::{Error, Result};

/// The algorithm forced on a collective, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced {
    /// The cost model chooses.
    Auto,
    /// Given for this collective (by name, the C API or a per-call algorithm): an algorithm
    /// that does not implement it is an error.
    Explicit(Algorithm),
    /// The plain form, given for every collective: one that it does not implement runs `auto`.
    Plain(Algorithm),
}

/// A communicator's algorithm setting, per collective.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AlgoSetting {
    /// The plain form (`FABRICOLL_ALGO=ring`); None: `auto`.
    pub all: Option<Algorithm>,
    /// Per collective (`Collective as usize`): `Some(None)`: `auto` given by name;
    /// `Some(Some(a))`: `a` given by name; None: `all`.
    pub per: [Option<Option<Algorithm>>; 6],
}

impl AlgoSetting {
    /// `a` forced on every collective, each one an error where `a` does not implement it
    /// (the C API's `config.algo` and `fabricoll_comm_set_algo`).
    pub fn everywhere(a: Option<Algorithm>) -> AlgoSetting {
        AlgoSetting {
            all: None,
            per: [Some(a); 6],
        }
    }

    /// What runs `c`.
    pub fn of(&self, c: Collective) -> Forced {
        match self.per[c as usize] {
            Some(Some(a)) => Forced::Explicit(a),
            Some(None) => Forced::Auto,
            None => self.all.map_or(Forced::Auto, Forced::Plain),
        }
    }

    /// Is every collective left to the cost model?
    pub fn is_auto(&self) -> bool {
        Collective::ALL.iter().all(|c| self.of(*c) == Forced::Auto)
    }

    /// The algorithms forced on some collective.
    pub fn forced(&self) -> impl Iterator<Item = Algorithm> + '_ {
        Collective::ALL
            .into_iter()
            .filter_map(|c| match self.of(c) {
                Forced::Auto => None,
                Forced::Explicit(a) | Forced::Plain(a) => Some(a),
            })
    }

    /// Parse `FABRICOLL_ALGO`'s value (`name` names the variable in errors): `;`-separated
    /// parts, each `ALGO` (at most one: every collective) or `COLL:ALGO`, case-insensitive.
    pub fn parse(name: &str, value: &str) -> Result<AlgoSetting> {
        let mut s = AlgoSetting::default();
        let mut plain = false;
        let bad = |part: &str, why: String| {
            Error::InvalidArgument(format!(
                "environment variable {name}={value:?} is invalid: {part:?} {why}"
            ))
        };
        let algorithm = |part: &str, v: &str| -> Result<Option<Algorithm>> {
            let v = v.trim().to_ascii_lowercase();
            if v == "auto" {
                return Ok(None);
            }
            let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            Algorithm::from_name(&v).map(Some).ok_or_else(|| {
                bad(
                    part,
                    format!(
                        "names no algorithm; accepted values: auto, {}",
                        names.join(", ")
                    ),
                )
            })
        };
        for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once(':') {
                None => {
                    if plain {
                        return Err(bad(
                            part,
                            "is a second algorithm for every collective".into(),
                        ));
                    }
                    plain = true;
                    s.all = algorithm(part, part)?;
                }
                Some((c, a)) => {
                    let c = c.trim().to_ascii_lowercase();
                    let coll = Collective::from_name(&c).ok_or_else(|| {
                            bad(
                                part,
                                "names no collective; accepted values: allreduce, allgather, reducescatter, broadcast, reduce, alltoall".into(),
                            )
                        })?;
                    if s.per[coll as usize].is_some() {
                        return Err(bad(part, "sets a collective a second time".into()));
                    }
                    let a = algorithm(part, a)?;
                    if let Some(a) = a {
                        if !algo::supports(a, coll) {
                            let ok: Vec<&str> = Algorithm::ALL
                                .iter()
                                .filter(|x| algo::supports(**x, coll))
                                .map(|x| x.name())
                                .collect();
                            return Err(bad(
                                part,
                                format!(
                                    "forces an algorithm that does not implement it; accepted values: auto, {}",
                                    ok.join(", ")
                                ),
                            ));
                        }
                    }
                    s.per[coll as usize] = Some(a);
                }
            }
        }
        if !plain && s.per.iter().all(Option::is_none) {
            return Err(bad(value, "sets nothing".into()));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Algorithm as A;
    use Collective as C;

    fn parse(v: &str) -> Result<AlgoSetting> {
        AlgoSetting::parse("FABRICOLL_ALGO", v)
    }

    #[test]
    fn the_plain_form_forces_where_it_implements() {
        let s = parse("Bruck").unwrap();
        assert_eq!(s.of(C::AllGather), Forced::Plain(A::Bruck));
        assert_eq!(s.of(C::AllReduce), Forced::Plain(A::Bruck));
        assert!(!s.is_auto());
        assert!(parse("auto").unwrap().is_auto());
    }

    #[test]
    fn per_collective_parts_are_explicit_and_case_insensitive() {
        let s = parse(" AllReduce:Ring ; allgather:bruck;BCAST:tree ").unwrap();
        assert_eq!(s.of(C::AllReduce), Forced::Explicit(A::Ring));
        assert_eq!(s.of(C::AllGather), Forced::Explicit(A::Bruck));
        assert_eq!(s.of(C::Broadcast), Forced::Explicit(A::Tree));
        assert_eq!(s.of(C::Reduce), Forced::Auto);
        let s = parse("ring;allgather:bruck;reduce_scatter:auto").unwrap();
        assert_eq!(s.of(C::AllGather), Forced::Explicit(A::Bruck));
        assert_eq!(s.of(C::AllReduce), Forced::Plain(A::Ring));
        assert_eq!(s.of(C::ReduceScatter), Forced::Auto);
    }

    #[test]
    fn errors_name_the_variable_and_the_bad_part() {
        for (v, part) in [
            ("allreduce:bruck", "allreduce:bruck"),
            ("allreduce:ring;gather:ring", "gather:ring"),
            ("allreduce:rung", "allreduce:rung"),
            ("ring;tree", "tree"),
            ("allreduce:ring;allreduce:tree", "allreduce:tree"),
            ("nope", "nope"),
            (";", ";"),
        ] {
            let e = parse(v).unwrap_err().to_string();
            assert!(e.contains("FABRICOLL_ALGO"), "{v}: {e}");
            assert!(e.contains(&format!("{part:?}")), "{v}: {e}");
        }
    }

    #[test]
    fn everywhere_is_explicit_for_each_collective() {
        let s = AlgoSetting::everywhere(Some(A::Bruck));
        assert_eq!(s.of(C::AllReduce), Forced::Explicit(A::Bruck));
        assert!(AlgoSetting::everywhere(None).is_auto());
        assert_eq!(s.forced().count(), 6);
    }
}
