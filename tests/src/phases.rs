//! The harness of the suites whose tests share a fabric: each test is a phase, run one after
//! another on one fabric (or other setup) built when the first phase the filter keeps needs it,
//! instead of one fabric per `#[test]`. A phase undoes what it changed (RAII guards, so a
//! failing one does too) or runs last. A phase that fails takes its fabric with it: the next
//! phase builds a fresh one, so one failure never leaves its state to the others. Only one
//! shared setup lives at a time: the first phase of the next group drops the one before.
//!
//! Output and arguments are libtest's (libtest-mimic): `cargo xtask test` counts the results
//! the same way, and a name filter runs the phases it names. Phases always run on the main
//! thread, one at a time, whatever `--test-threads` says: they share one fabric.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    process::ExitCode,
    sync::{Arc, Mutex, MutexGuard},
    time::Instant,
};

use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// What a group's phases share, as its slot holds it.
enum State<T> {
    /// Not built yet, or dropped after a failed phase or for another group.
    Empty,
    /// Built; `true` once a phase ran on it.
    Ready(T, bool),
    /// Building it failed: every later phase of the group fails at once with this, rather
    /// than trying again for minutes.
    Broken(String),
}

struct Slot<T> {
    what: &'static str,
    build: Box<dyn Fn() -> T + Send + Sync>,
    /// What every phase after the first on one build must find (the last phase left the
    /// fabric as it found it): checked before the phase runs.
    check: Option<Check<T>>,
    state: Mutex<State<T>>,
}

/// A check of a shared setup before a phase: `Err` says what is not as it should be.
pub type Check<T> = fn(&mut T) -> Result<(), String>;

/// Any group's slot, for dropping what it holds.
trait Clear: Send + Sync {
    fn clear(&self);
}

impl<T: Send> Clear for Slot<T> {
    fn clear(&self) {
        let old = std::mem::replace(&mut *lock(&self.state), State::Empty);
        if let State::Ready(t, _) = old {
            let start = Instant::now();
            drop(t);
            eprintln!(
                "[phases] {} removed in {:.1} s",
                self.what,
                start.elapsed().as_secs_f64()
            );
        }
    }
}

/// A poisoned lock only says a phase panicked while holding it; the state is still whole.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic without a message".into())
}

/// A phase: its test name, and what it does to the shared `T`.
pub type Phase<T> = (&'static str, fn(&mut T));

/// A test binary's phases and tests, in the order they run.
#[derive(Default)]
pub struct Suite {
    trials: Vec<Trial>,
    slots: Arc<Mutex<Vec<Arc<dyn Clear>>>>,
}

impl Suite {
    pub fn new() -> Self {
        Self::default()
    }

    /// `phases`, in this order, sharing one `T` that `build` makes (`what` names it in the
    /// log). `build` panics with its reason when it cannot. `check`, where given, runs before
    /// each phase after the first on one build: a phase that left the setup changed fails the
    /// next one, naming what it left, and the setup is built again for the rest.
    pub fn shared<T: Send + 'static>(
        mut self,
        what: &'static str,
        build: impl Fn() -> T + Send + Sync + 'static,
        check: Option<Check<T>>,
        phases: Vec<Phase<T>>,
    ) -> Self {
        let slot = Arc::new(Slot {
            what,
            build: Box::new(build),
            check,
            state: Mutex::new(State::Empty),
        });
        let me: Arc<dyn Clear> = slot.clone();
        lock(&self.slots).push(me.clone());
        for (name, phase) in phases {
            let (slot, all, me) = (slot.clone(), self.slots.clone(), me.clone());
            self.trials.push(Trial::test(name, move || {
                // One shared setup at a time: the 2 cores run one fabric's agents.
                for other in lock(&all).iter().filter(|o| !Arc::ptr_eq(o, &me)) {
                    other.clear();
                }
                run_phase(&slot, phase)
            }));
        }
        self
    }

    /// A test with a setup of its own (one that no phase of a shared one could run).
    pub fn alone(mut self, name: &'static str, test: fn()) -> Self {
        let all = self.slots.clone();
        self.trials.push(Trial::test(name, move || {
            for slot in lock(&all).iter() {
                slot.clear();
            }
            catch_unwind(test).map_err(|p| Failed::from(panic_text(&*p)))
        }));
        self
    }

    /// A test this kernel cannot run (it lacks what the test exists for): reported as ignored
    /// and recorded as skipped with `why` (`crate::skipped`), never as passed.
    pub fn skip(mut self, name: &'static str, why: String) -> Self {
        self.trials.push(Trial::ignorable_test(name, move || {
            crate::skipped(name, &why);
            Ok(Completion::ignored_with(why))
        }));
        self
    }

    /// Runs what the command line's filter keeps, drops every shared setup, and returns the
    /// exit code libtest would.
    pub fn run(mut self) -> ExitCode {
        // libtest takes several name filters (any may match); libtest-mimic one: the others
        // are applied here.
        let (filters, rest) = filters_and_rest(std::env::args().skip(1));
        let mut args = Arguments::from_iter(std::iter::once("suite".to_owned()).chain(rest));
        if !filters.is_empty() {
            let exact = args.exact;
            self.trials.retain(|t| {
                filters.iter().any(|f| {
                    if exact {
                        t.name() == f
                    } else {
                        t.name().contains(f.as_str())
                    }
                })
            });
        }
        // Phases share one fabric: never two at a time.
        args.test_threads = Some(1);
        let conclusion = libtest_mimic::run(&args, self.trials);
        for slot in lock(&self.slots).iter() {
            slot.clear();
        }
        conclusion.exit_code()
    }
}

/// The command line's name filters (its free arguments), and the rest of it.
fn filters_and_rest(args: impl Iterator<Item = String>) -> (Vec<String>, Vec<String>) {
    // libtest's options that take a value as the next argument.
    const WITH_VALUE: [&str; 5] = [
        "--test-threads",
        "--logfile",
        "--skip",
        "--color",
        "--format",
    ];
    let (mut filters, mut rest) = (Vec::new(), Vec::new());
    let mut value_next = false;
    for a in args {
        if value_next {
            value_next = false;
            rest.push(a);
        } else if a.starts_with('-') {
            value_next = WITH_VALUE.contains(&a.as_str());
            rest.push(a);
        } else {
            filters.push(a);
        }
    }
    (filters, rest)
}

fn run_phase<T: Send>(slot: &Slot<T>, phase: fn(&mut T)) -> Result<(), Failed> {
    let mut state = lock(&slot.state);
    if let (State::Ready(shared, true), Some(check)) = (&mut *state, slot.check)
        && let Err(left) = check(shared)
    {
        drop(state);
        slot.clear();
        return Err(format!(
            "{} is not as the phase before this one should have left it: {left}",
            slot.what
        )
        .into());
    }
    if matches!(*state, State::Empty) {
        let start = Instant::now();
        *state = match catch_unwind(AssertUnwindSafe(|| (slot.build)())) {
            Ok(t) => {
                eprintln!(
                    "[phases] {} built in {:.1} s",
                    slot.what,
                    start.elapsed().as_secs_f64()
                );
                State::Ready(t, false)
            }
            Err(p) => State::Broken(panic_text(&*p)),
        };
    }
    let shared = match &mut *state {
        State::Ready(t, ran) => {
            *ran = true;
            t
        }
        State::Broken(why) => {
            return Err(format!("{} could not be built: {why}", slot.what).into());
        }
        State::Empty => unreachable!("built above"),
    };
    let start = Instant::now();
    let ran = catch_unwind(AssertUnwindSafe(|| phase(shared)));
    eprintln!("[phases] took {:.1} s", start.elapsed().as_secs_f64());
    match ran {
        Ok(()) => Ok(()),
        Err(p) => {
            // What the failed phase left is not for the next one.
            drop(state);
            slot.clear();
            Err(panic_text(&*p).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::filters_and_rest;

    #[test]
    fn every_free_argument_is_a_filter_and_option_values_are_not() {
        let args = [
            "gray",
            "--test-threads=1",
            "--skip",
            "hedera",
            "ecmp",
            "--exact",
        ]
        .map(String::from);
        let (filters, rest) = filters_and_rest(args.into_iter());
        assert_eq!(filters, ["gray", "ecmp"]);
        assert_eq!(rest, ["--test-threads=1", "--skip", "hedera", "--exact"]);
    }
}
