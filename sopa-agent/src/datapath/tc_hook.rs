//! Where the TC programs (`tc_stamp`, `tc_forward`) attach: TCX links (Linux 6.6), pinned so
//! they outlive the agent and are replaced in place; or, on a kernel without TCX, cls_bpf
//! filters in direct-action mode on a `clsact` qdisc, which the kernel keeps after the agent
//! exits just as well, found again by their place (interface, direction, priority, handle)
//! and replaced there. Other tools' filters are left alone: ours sit at handle 0x50a of
//! priority 65520 (last) or 1 (first), a place another filter takes is refused, only a filter
//! there running one of our programs is ever removed, and a `clsact` qdisc the agent did not
//! create is never removed (`changes::Change::Clsact` records one it did).

use aya::programs::{
    Link as _, SchedClassifier, TcAttachType,
    tc::{NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
};
use serde::{Deserialize, Serialize};

use super::{Hook, TcxOrder};
pub use crate::netlink::tc::Filter;
use crate::{
    changes::Change,
    error::{Error, Result},
    netlink::Netlink,
    probe,
};

/// The names of the programs our filters run: a filter at our place running anything else is
/// not ours.
pub const OUR_PROGRAMS: [&str; 2] = ["tc_stamp", "tc_forward"];

/// `--attach`: how the TC programs attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// TCX where the kernel has it (Linux 6.6), cls_bpf filters otherwise.
    #[default]
    Auto,
    /// TCX links; refused at start on a kernel without them.
    Tcx,
    /// cls_bpf filters on a clsact qdisc (on any kernel; for testing where TCX is there).
    Tc,
}

/// How the TC programs attach, as chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TcHook {
    Tcx,
    Filter,
}

impl TcHook {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcx => "tcx",
            Self::Filter => "tc",
        }
    }
}

/// What `mode` comes to on this kernel; with the words of the fallback where the kernel's
/// lack of TCX made the choice.
pub fn choose(mode: AttachMode) -> Result<(TcHook, Option<String>)> {
    let v = probe::kernel_version()?;
    let tcx = probe::tcx(v);
    match (mode, tcx) {
        (AttachMode::Tcx, false) => Err(Error::Kernel(format!(
            "--attach tcx: Linux {v} has no TCX (Linux {}.{}); run with --attach auto or tc, \
             where the programs attach as cls_bpf filters on a clsact qdisc",
            probe::TCX_SINCE.0,
            probe::TCX_SINCE.1
        ))),
        (AttachMode::Tcx | AttachMode::Auto, true) => Ok((TcHook::Tcx, None)),
        (AttachMode::Auto, false) => Ok((
            TcHook::Filter,
            Some(format!(
                "the TC programs attach as cls_bpf filters on a clsact qdisc: Linux {v} has no \
                 TCX (Linux {}.{})",
                probe::TCX_SINCE.0,
                probe::TCX_SINCE.1
            )),
        )),
        (AttachMode::Tc, _) => Ok((
            TcHook::Filter,
            (!tcx).then(|| {
                format!("the TC programs attach as cls_bpf filters: Linux {v} has no TCX")
            }),
        )),
    }
}

/// Our filters' handle, in every direction of every interface.
pub const FILTER_HANDLE: u32 = 0x50A;

/// Where a new filter of ours goes on `ifname`: before every other filter (`first`, priority
/// one) or after them (`last`, a priority past the kernel's own choices, which count down
/// from 49152).
pub fn filter(ifname: &str, index: u32, ingress: bool, order: TcxOrder) -> Filter {
    Filter {
        ifname: ifname.to_owned(),
        index,
        ingress,
        priority: match order {
            TcxOrder::First => 1,
            TcxOrder::Last => 0xFFF0,
        },
        handle: FILTER_HANDLE,
    }
}

fn attach_type(f: &Filter) -> TcAttachType {
    if f.ingress {
        TcAttachType::Ingress
    } else {
        TcAttachType::Egress
    }
}

/// Attaches `program` as filter `f`: replacing the program of the filter that is there
/// already (`replace`, an adopted datapath: the filter never goes without a program), or as a
/// new filter (refused if something sits at its place). The filter stays until [`detach`]
/// removes it, whatever becomes of this process.
pub fn attach(
    f: &Filter,
    program: &mut SchedClassifier,
    replace: bool,
) -> std::result::Result<(), aya::programs::ProgramError> {
    let id = if replace {
        let link = SchedClassifierLink::attached(
            &f.ifname,
            attach_type(f),
            f.priority,
            TcHandle::from(f.handle),
            None,
        )
        .map_err(|e| aya::programs::ProgramError::TcError(e.into()))?;
        program.attach_to_link(link)?
    } else {
        program.attach_with_options(
            &f.ifname,
            attach_type(f),
            TcAttachOptions::Netlink(NlOptions {
                priority: f.priority,
                handle: TcHandle::from(f.handle),
                classid: None,
            }),
        )?
    };
    // The link would remove the filter when dropped: the filter is the kernel's to keep.
    std::mem::forget(program.take_link(id)?);
    Ok(())
}

/// What an interface has, for [`place`]: a clsact qdisc, and the filters under it.
pub struct Seen {
    pub clsact: bool,
    pub filters: Vec<crate::netlink::tc::TcFilter>,
}

/// What interface `index` has now.
pub async fn look(netlink: &Netlink, index: u32) -> Result<Seen> {
    let clsact = netlink.has_clsact(index).await?;
    Ok(Seen {
        clsact,
        filters: if clsact {
            netlink.tc_filters(index).await?
        } else {
            Vec::new()
        },
    })
}

/// Where a TC program goes on `ifname` (`index`), in direction `ingress`, attached the way
/// `hook` says, decided from what is there and what `recorded` (the journal, an adopted
/// datapath's entries among them) says. A datapath attached the other way is refused, not
/// attached twice. Our filter that the kernel still lists keeps its place and gets the new
/// program in place. Otherwise a new filter: refused before anything is recorded when another's
/// filter sits at that place, recorded (`push`; with the clsact qdisc, where the agent adds
/// one) before it is made; a recorded filter the kernel no longer lists is dropped from the
/// record (`forget`).
#[allow(clippy::too_many_arguments)]
pub fn place(
    hook: TcHook,
    order: TcxOrder,
    (ifname, index, ingress): (&str, u32, bool),
    tcx_pinned: bool,
    seen: &Seen,
    recorded: &[Change],
    push: &mut dyn FnMut(Change) -> Result<()>,
    forget: &mut dyn FnMut(&Change) -> Result<()>,
) -> Result<Hook> {
    let direction = if ingress { "ingress" } else { "egress" };
    let stale = recorded.iter().find(|c| {
        matches!(c, Change::TcFilter { filter } if filter.index == index && filter.ingress == ingress)
    });
    let listed = &seen.filters;
    let recorded_place = stale.and_then(|c| match c {
        Change::TcFilter { filter } => Some(filter.clone()),
        _ => None,
    });
    let ours_listed = recorded_place
        .as_ref()
        .and_then(|f| listed.iter().find(|k| k.is_at(f)));
    match hook {
        TcHook::Tcx => {
            if ours_listed.is_some() {
                return Err(Error::Config(format!(
                    "{direction} of {ifname} was attached as a cls_bpf filter by the previous \
                     agent: start this one with --attach tc to adopt it, or --reset to start clean"
                )));
            }
            if let Some(c) = stale {
                forget(c)?;
            }
            Ok(Hook::Tcx(order))
        }
        TcHook::Filter if tcx_pinned => Err(Error::Config(format!(
            "{direction} of {ifname} was attached as a TCX link by the previous agent: start this \
             one with --attach tcx to adopt it, or --reset to start clean"
        ))),
        TcHook::Filter => {
            if let (Some(place), Some(k)) = (&recorded_place, ours_listed) {
                return match &k.program {
                    Some((id, name)) if OUR_PROGRAMS.contains(&name.as_str()) => Ok(Hook::Filter {
                        filter: place.clone(),
                        replaces: Some(*id),
                    }),
                    other => Err(Error::Config(format!(
                        "{direction} of {ifname} has a filter at priority {} handle {:#x} that \
                         runs {other:?}, not ours; remove it or start with --reset",
                        place.priority, place.handle
                    ))),
                };
            }
            if let Some(c) = stale {
                forget(c)?;
            }
            let new = filter(ifname, index, ingress, order);
            if let Some(k) = listed.iter().find(|k| k.is_at(&new)) {
                return Err(Error::Config(format!(
                    "{direction} of {ifname} has another's filter at priority {} handle {:#x} \
                     ({:?}), where ours goes; remove it, or start with the other --tcx-order",
                    new.priority, new.handle, k.program
                )));
            }
            if !seen.clsact {
                let qdisc = Change::Clsact {
                    ifname: ifname.to_owned(),
                    index,
                };
                push(qdisc.clone())?;
                if !add_clsact(ifname)? {
                    // Another tool added one meanwhile: it is theirs.
                    forget(&qdisc)?;
                }
            }
            push(Change::TcFilter {
                filter: new.clone(),
            })?;
            Ok(Hook::Filter {
                filter: new,
                replaces: None,
            })
        }
    }
}

/// Removes filter `f`; one already gone (or its interface) is not an error.
pub fn detach(f: &Filter) -> Result<()> {
    let Ok(link) = SchedClassifierLink::attached(
        &f.ifname,
        attach_type(f),
        f.priority,
        TcHandle::from(f.handle),
        None,
    ) else {
        // The interface is gone, and the filter with it.
        return Ok(());
    };
    match link.detach() {
        Ok(()) => Ok(()),
        Err(err) if is_gone(&err) => Ok(()),
        Err(err) => Err(Error::Config(format!(
            "removing our {} filter on {} (priority {}, handle {:#x}): {err}",
            if f.ingress { "ingress" } else { "egress" },
            f.ifname,
            f.priority,
            f.handle
        ))),
    }
}

/// The OS error under a netlink failure, if there is one.
fn os_error(err: &aya::programs::ProgramError) -> Option<i32> {
    use aya::programs::{ProgramError, tc::TcError};
    match err {
        ProgramError::NetlinkError(e) | ProgramError::TcError(TcError::NetlinkError(e)) => {
            e.raw_os_error()
        }
        ProgramError::TcError(TcError::IoError(e)) => e.raw_os_error(),
        _ => None,
    }
}

/// A netlink error that says the filter (or its interface) is not there.
fn is_gone(err: &aya::programs::ProgramError) -> bool {
    matches!(os_error(err), Some(libc::ENOENT | libc::ENODEV))
}

/// Whether `err` says something sits at the place a new filter was to take.
pub fn is_taken(err: &aya::programs::ProgramError) -> bool {
    os_error(err) == Some(libc::EEXIST)
}

/// Adds a clsact qdisc to `ifname`: `Ok(true)` when it added one, `Ok(false)` when one was
/// there already.
pub fn add_clsact(ifname: &str) -> Result<bool> {
    use aya::programs::tc::TcError;
    match aya::programs::tc::qdisc_add_clsact(ifname) {
        Ok(()) => Ok(true),
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(err) => Err(Error::Config(format!(
            "adding a clsact qdisc to {ifname} (the kernel needs CONFIG_NET_SCH_INGRESS): {err}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_filters_sit_first_or_last_at_our_handle() {
        let last = filter("eth0", 2, false, TcxOrder::Last);
        assert_eq!((last.priority, last.handle), (0xFFF0, FILTER_HANDLE));
        assert_eq!(filter("eth0", 2, true, TcxOrder::First).priority, 1);
    }
}
