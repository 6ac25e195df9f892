//! A gray link: one end of a fabric link drops a share of the packets it sends while its
//! carrier stays up, through `tc_lossy` (the kernel has no netem). The program is attached
//! through a TCX link this process holds: dropping the [`LossyLink`] removes it.

use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray},
    programs::{SchedClassifier, TcAttachType},
};
use sopa_common::maps::lossy;

use crate::{Error, NetNs, Result};

pub struct LossyLink {
    ebpf: Ebpf,
    pub iface: String,
    /// Where the object's pinned maps go (the datapath's, unused here): a folder of this link's
    /// own, removed on drop, never the bpffs root.
    pins: std::path::PathBuf,
}

impl Drop for LossyLink {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.pins);
    }
}

fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> Error + '_ {
    move |e| Error::Failed(format!("{what}: {e}"))
}

impl LossyLink {
    /// Attaches `tc_lossy` at TC egress of `iface` in `ns`, dropping nothing yet.
    pub fn attach(ns: &NetNs, iface: &str) -> Result<Self> {
        let name = iface.to_owned();
        let pins = std::path::PathBuf::from("/sys/fs/bpf").join(crate::run_name("lossy"));
        std::fs::create_dir_all(&pins).map_err(|e| Error::io("creating a pin folder", e))?;
        let dir = pins.clone();
        let ebpf = ns.run(move || -> Result<Ebpf> {
            let mut ebpf = aya::EbpfLoader::new()
                .default_map_pin_directory(&dir)
                .load(sopa_agent::datapath::OBJECT)
                .map_err(|e| failed("loading the programs' object")(&e))?;
            let program: &mut SchedClassifier = ebpf
                .program_mut(lossy::PROGRAM)
                .ok_or_else(|| Error::Failed(format!("the object has no {}", lossy::PROGRAM)))?
                .try_into()
                .map_err(|e| failed(lossy::PROGRAM)(&e))?;
            program.load().map_err(|e| failed("loading tc_lossy")(&e))?;
            program
                .attach(&name, TcAttachType::Egress)
                .map_err(|e| failed(&format!("attaching tc_lossy to {name}"))(&e))?;
            Ok(ebpf)
        })??;
        Ok(Self {
            ebpf,
            iface: iface.to_owned(),
            pins,
        })
    }

    /// Drops `percent` of the IP packets from now on (0 heals the link).
    pub fn set_loss(&mut self, percent: f64) -> Result<()> {
        let rate = (percent / 100.0 * f64::from(lossy::PER)).round() as u32;
        let mut map: Array<&mut MapData, u32> = self
            .ebpf
            .map_mut(lossy::RATE_MAP)
            .ok_or_else(|| Error::Failed(format!("no map {}", lossy::RATE_MAP)))?
            .try_into()
            .map_err(|e| failed(lossy::RATE_MAP)(&e))?;
        map.set(0, rate, 0).map_err(|e| failed(lossy::RATE_MAP)(&e))
    }

    /// (IP packets seen, dropped) since attached.
    pub fn counts(&self) -> Result<(u64, u64)> {
        let map: PerCpuArray<&MapData, u64> = self
            .ebpf
            .map(lossy::STATS_MAP)
            .ok_or_else(|| Error::Failed(format!("no map {}", lossy::STATS_MAP)))?
            .try_into()
            .map_err(|e| failed(lossy::STATS_MAP)(&e))?;
        let sum = |i: u32| -> Result<u64> {
            Ok(map
                .get(&i, 0)
                .map_err(|e| failed(lossy::STATS_MAP)(&e))?
                .iter()
                .sum())
        };
        Ok((sum(lossy::SEEN)?, sum(lossy::DROPPED)?))
    }
}
