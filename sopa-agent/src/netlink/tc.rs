//! The `clsact` qdisc and the filters under it, where the TC programs attach as cls_bpf filters
//! (a kernel without TCX): whether an interface has the qdisc, which filters it holds, and
//! removing a qdisc the agent created once nothing else uses it. Attaching itself goes through
//! aya (`datapath::tc_hook`).

use futures::StreamExt as _;
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcHandle, TcMessage},
};

use super::{Netlink, errno};
use crate::error::{Error, Result};

/// `TC_H_CLSACT`, the clsact qdisc's parent, and its ingress and egress minors.
const CLSACT_PARENT: TcHandle = TcHandle {
    major: 0xffff,
    minor: 0xfff1,
};
pub const INGRESS_PARENT: TcHandle = TcHandle {
    major: 0xffff,
    minor: 0xfff2,
};
pub const EGRESS_PARENT: TcHandle = TcHandle {
    major: 0xffff,
    minor: 0xfff3,
};

/// A filter of the agent's: where it sits, which is all it takes to find it again
/// (`datapath::tc_hook` attaches and removes it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Filter {
    pub ifname: String,
    pub index: u32,
    pub ingress: bool,
    pub priority: u16,
    pub handle: u32,
}

/// One filter under a clsact qdisc, as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcFilter {
    pub ingress: bool,
    pub priority: u16,
    pub handle: u32,
    /// A cls_bpf filter's program: its id and name.
    pub program: Option<(u32, String)>,
}

impl TcFilter {
    /// Whether this is the filter `f` describes (its place).
    pub fn is_at(&self, f: &Filter) -> bool {
        self.ingress == f.ingress && self.priority == f.priority && self.handle == f.handle
    }
}

/// `TCA_BPF_NAME` and `TCA_BPF_ID` in a cls_bpf filter's options.
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_ID: u16 = 11;

/// The program of a cls_bpf filter's options (which the crate keeps as one raw attribute).
fn bpf_program(options: &[netlink_packet_route::tc::TcOption]) -> Option<(u32, String)> {
    use netlink_packet_utils::nla::{Nla as _, NlasIterator};
    let raw = options.iter().find_map(|o| match o {
        netlink_packet_route::tc::TcOption::Other(nla) => Some(nla),
        _ => None,
    })?;
    let mut value = vec![0; raw.value_len()];
    raw.emit_value(&mut value);
    let (mut id, mut name) = (None, None);
    for nla in NlasIterator::new(&value[..]).flatten() {
        match nla.kind() {
            TCA_BPF_ID if nla.value().len() >= 4 => {
                id = Some(u32::from_ne_bytes(nla.value()[..4].try_into().ok()?));
            }
            TCA_BPF_NAME => {
                name = Some(
                    String::from_utf8_lossy(nla.value())
                        .trim_end_matches('\0')
                        .to_owned(),
                );
            }
            _ => {}
        }
    }
    Some((id?, name.unwrap_or_default()))
}

impl Netlink {
    async fn tc_dump(&self, message: RouteNetlinkMessage) -> Result<Vec<TcMessage>> {
        let mut request = NetlinkMessage::from(message);
        request.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut answers = self
            .handle
            .clone()
            .request(request)
            .map_err(|e| Error::netlink("listing traffic control objects", e))?;
        let mut out = Vec::new();
        while let Some(answer) = answers.next().await {
            match answer.payload {
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewQueueDiscipline(m)
                    | RouteNetlinkMessage::NewTrafficFilter(m),
                ) => out.push(m),
                NetlinkPayload::Error(err) if err.code.is_some() => {
                    return Err(Error::netlink(
                        "listing traffic control objects",
                        rtnetlink::Error::NetlinkError(err),
                    ));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Whether interface `index` has a clsact qdisc.
    pub async fn has_clsact(&self, index: u32) -> Result<bool> {
        let qdiscs = self
            .tc_dump(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()))
            .await?;
        Ok(qdiscs.iter().any(|q| {
            q.header.index == index as i32
                && q.attributes
                    .iter()
                    .any(|a| matches!(a, TcAttribute::Kind(k) if k == "clsact"))
        }))
    }

    /// The filters under interface `index`'s clsact qdisc, both directions (one entry per
    /// filter, not per protocol or chain it lists).
    pub async fn tc_filters(&self, index: u32) -> Result<Vec<TcFilter>> {
        let mut out = Vec::new();
        for (parent, ingress) in [(INGRESS_PARENT, true), (EGRESS_PARENT, false)] {
            let mut msg = TcMessage::default();
            msg.header.index = index as i32;
            msg.header.parent = parent;
            for f in self
                .tc_dump(RouteNetlinkMessage::GetTrafficFilter(msg))
                .await?
            {
                let program = f.attributes.iter().find_map(|a| match a {
                    TcAttribute::Options(o) => bpf_program(o),
                    _ => None,
                });
                let filter = TcFilter {
                    ingress,
                    priority: (f.header.info >> 16) as u16,
                    handle: u32::from(f.header.handle),
                    program,
                };
                // The kernel lists a priority's protocol header once with handle 0.
                if filter.handle != 0 && !out.contains(&filter) {
                    out.push(filter);
                }
            }
        }
        Ok(out)
    }

    /// Removes interface `index`'s clsact qdisc (and with it whatever filters it holds: the
    /// caller checked it holds none but ours). Already gone is not an error.
    pub async fn delete_clsact(&self, index: u32) -> Result<()> {
        let mut msg = TcMessage::default();
        msg.header.index = index as i32;
        msg.header.parent = CLSACT_PARENT;
        msg.header.handle = TcHandle {
            major: 0xffff,
            minor: 0,
        };
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::DelQueueDiscipline(msg));
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        let mut answers = self
            .handle
            .clone()
            .request(request)
            .map_err(|e| Error::netlink("removing the clsact qdisc", e))?;
        while let Some(answer) = answers.next().await {
            if let NetlinkPayload::Error(err) = answer.payload
                && err.code.is_some()
            {
                let err = rtnetlink::Error::NetlinkError(err);
                if matches!(
                    errno(&err),
                    Some(libc::ENOENT | libc::EINVAL | libc::ENODEV)
                ) {
                    return Ok(());
                }
                return Err(Error::netlink("removing the clsact qdisc", err));
            }
        }
        Ok(())
    }
}
