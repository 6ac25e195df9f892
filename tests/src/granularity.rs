//! The flowcell sweep (`bench fabric --experiment granularity`): SOPA on the permutation per
//! packet and with flowcells of N segments, beside the non-blocking ideal, at several link
//! rates. Each row puts a flowcell in time on the wire, the unit that carries over to other
//! link rates, and compares it with per-packet spraying at the same rate: throughput against
//! the ideal, and the machine's CPU per GB moved.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{Result, experiment::ModeResult};

/// Bytes a full-size segment takes on the wire with the option (1500-byte packet + Ethernet).
pub const WIRE_BYTES: f64 = 1514.0;
/// The most segments a GSO super-packet holds (64 KB of 1448-byte segments).
pub const MAX_GSO_SEGS: u32 = 44;
/// What a flowcell must keep of per-packet throughput (mean over the ideal) ...
pub const KEEP_THROUGHPUT: f64 = 0.95;
/// ... at no more than this fraction of per-packet CPU per GB.
pub const MAX_CPU_RATIO: f64 = 0.5;

/// One mode of one rate, set against per-packet spraying and the ideal of that rate.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct Row {
    pub rate_mbit: u32,
    pub mode: String,
    /// Segments per unit (1 per packet).
    pub segments: u32,
    /// The unit's time on the wire at this rate, µs.
    pub wire_us: f64,
    pub mean_over_ideal: f64,
    pub min_over_ideal: f64,
    /// Mean throughput over per-packet spraying's at this rate.
    pub over_packet: f64,
    pub fct_p99_s: f64,
    pub reordered_pct: f64,
    pub cpu_s_per_gb: f64,
    /// CPU per GB over per-packet spraying's at this rate.
    pub cpu_over_packet: f64,
}

/// Segments per unit of a `sopa` mode (`sopa` 1, `sopa+cellN` N, `sopa+burst` 44); `None`
/// for other modes.
pub fn segments(mode: &str) -> Option<u32> {
    let m: crate::experiment::ModeSpec = mode.parse().ok()?;
    if m.base != "sopa" {
        return None;
    }
    match m.granularity.as_str() {
        "packet" => Some(1),
        "burst" => Some(MAX_GSO_SEGS),
        g => g.strip_prefix("flowcell:")?.parse().ok(),
    }
}

/// A unit of `segments` full segments on a link of `rate_mbit`, in µs.
pub fn wire_us(segments: u32, rate_mbit: u32) -> f64 {
    f64::from(segments) * WIRE_BYTES * 8.0 / f64::from(rate_mbit)
}

/// The rows of one rate's results (which must hold `ideal` and `sopa`).
pub fn rows(rate_mbit: u32, results: &[ModeResult]) -> Vec<Row> {
    let find = |m: &str| results.iter().find(|r| r.mode == m);
    let (Some(ideal), Some(packet)) = (find("ideal"), find("sopa")) else {
        return Vec::new();
    };
    let mut rows: Vec<Row> = results
        .iter()
        .filter_map(|r| {
            let n = segments(&r.mode)?;
            Some(Row {
                rate_mbit,
                mode: r.mode.clone(),
                segments: n,
                wire_us: wire_us(n, rate_mbit),
                mean_over_ideal: r.mean / ideal.mean.max(1e-9),
                min_over_ideal: r.min / ideal.mean.max(1e-9),
                over_packet: r.mean / packet.mean.max(1e-9),
                fct_p99_s: r.fct_p99_s,
                reordered_pct: r.reordered_pct,
                cpu_s_per_gb: r.cpu_s_per_gb,
                cpu_over_packet: r.cpu_s_per_gb / packet.cpu_s_per_gb.max(1e-9),
            })
        })
        .collect();
    rows.sort_by_key(|r| r.segments);
    rows
}

/// The shortest flowcell (in time on the wire) that keeps [`KEEP_THROUGHPUT`] of per-packet
/// throughput at no more than [`MAX_CPU_RATIO`] of its CPU, over every rate's rows.
pub fn best(rows: &[Row]) -> Option<&Row> {
    rows.iter()
        .filter(|r| {
            r.segments > 1 && r.over_packet >= KEEP_THROUGHPUT && r.cpu_over_packet <= MAX_CPU_RATIO
        })
        .min_by(|a, b| a.wire_us.total_cmp(&b.wire_us))
}

/// Segments per flowcell at `gbit` Gbit/s for a flowcell of `wire_us` µs (at least 1, at most
/// a GSO super-packet).
pub fn segments_at(wire_us: f64, gbit: f64) -> u32 {
    ((wire_us * gbit * 1e3 / (WIRE_BYTES * 8.0)).round() as u32).clamp(1, MAX_GSO_SEGS)
}

/// The table, one line per row.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:>6} {:<14} {:>5} {:>9} {:>10} {:>9} {:>9} {:>9} {:>8} {:>9} {:>8}\n",
        "Mbit/s",
        "mode",
        "segs",
        "wire ms",
        "mean/ideal",
        "min/ideal",
        "/packet",
        "p99 FCT",
        "reord %",
        "CPU s/GB",
        "CPU/pkt"
    );
    for r in rows {
        out.push_str(&format!(
            "{:>6} {:<14} {:>5} {:>9.2} {:>10.3} {:>9.3} {:>9.3} {:>8.2}s {:>8.2} {:>9.1} {:>8.2}\n",
            r.rate_mbit,
            r.mode,
            r.segments,
            r.wire_us / 1e3,
            r.mean_over_ideal,
            r.min_over_ideal,
            r.over_packet,
            r.fct_p99_s,
            r.reordered_pct,
            r.cpu_s_per_gb,
            r.cpu_over_packet
        ));
    }
    out
}

/// Throughput over the ideal and CPU over per-packet, against the flowcell's time on the wire
/// (log scale), one line per rate.
pub fn figure(rows: &[Row], dir: &Path, name: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)
        .map_err(|e| crate::Error::io(format!("creating {}", dir.display()), e))?;
    let path = dir.join(format!("{name}.svg"));
    let mut rates: Vec<u32> = rows.iter().map(|r| r.rate_mbit).collect();
    rates.dedup();
    let mut series = Vec::new();
    for rate in rates {
        let of_rate = || rows.iter().filter(move |r| r.rate_mbit == rate);
        series.push((
            format!("throughput / ideal, {rate} Mbit/s"),
            of_rate()
                .map(|r| (r.wire_us.log10(), r.mean_over_ideal))
                .collect(),
        ));
        series.push((
            format!("CPU per GB / per packet, {rate} Mbit/s"),
            of_rate()
                .map(|r| (r.wire_us.log10(), r.cpu_over_packet))
                .collect(),
        ));
    }
    crate::figures::lines(
        &path,
        "SOPA flowcells on the permutation",
        "log10 of the flowcell's time on the wire (us)",
        "ratio",
        &series,
    )?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(mode: &str, mean: f64, cpu: f64) -> ModeResult {
        serde_json::from_value(serde_json::json!({
            "mode": mode, "flows": 16, "mean": mean, "min": mean * 0.9, "p5": mean, "p99": mean,
            "fct_mean_s": 1.0, "fct_p99_s": 2.0, "reordered_pct": 1.0, "fast_retransmits": 0,
            "timeouts": 0, "retrans_segs": 0, "queue_drops": 0, "core_links": [],
            "core_links_max_over_min": 1.0, "idle_cpu_pct": 50.0, "cpu_s_per_gb": cpu,
            "per_flow": []
        }))
        .unwrap()
    }

    #[test]
    fn rows_put_flowcells_against_per_packet_and_the_ideal() {
        assert_eq!(segments("sopa"), Some(1));
        assert_eq!(segments("sopa+cell8"), Some(8));
        assert_eq!(segments("sopa+burst"), Some(MAX_GSO_SEGS));
        assert_eq!(segments("ideal"), None);
        assert_eq!(segments("rps+cell8"), None);
        // 1514 bytes at 10 Mbit/s: 1.21 ms.
        assert!((wire_us(1, 10) - 1211.2).abs() < 0.1);
        let results = [
            result("ideal", 0.9, 10.0),
            result("sopa", 0.8, 100.0),
            result("sopa+cell4", 0.78, 45.0),
            result("sopa+cell2", 0.79, 60.0),
            result("sopa+cell8", 0.7, 30.0),
        ];
        let r = rows(10, &results);
        let modes: Vec<&str> = r.iter().map(|r| r.mode.as_str()).collect();
        assert_eq!(modes, ["sopa", "sopa+cell2", "sopa+cell4", "sopa+cell8"]);
        assert!((r[2].over_packet - 0.975).abs() < 1e-9);
        assert!((r[2].cpu_over_packet - 0.45).abs() < 1e-9);
        assert!((r[0].mean_over_ideal - 0.8 / 0.9).abs() < 1e-9);
        // cell2 keeps the throughput but not half the CPU; cell8 halves the CPU but loses
        // throughput; cell4 does both.
        assert_eq!(best(&r).unwrap().mode, "sopa+cell4");
        assert!(rows(10, &results[1..]).is_empty(), "no ideal, no rows");
        // 4 segments at 10 Mbit/s are 4.8 ms: at 100 Gbit/s far more than a GSO burst.
        assert_eq!(segments_at(r[2].wire_us, 100.0), MAX_GSO_SEGS);
        assert_eq!(segments_at(1.0, 25.0), 2);
    }
}
