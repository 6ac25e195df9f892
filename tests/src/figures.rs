//! Figures of an experiment's report, as SVG: the CDF of per-flow throughput (the SOPA paper's
//! Fig. 11) and of flow completion times, one line per mode.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::{Error, Result, experiment::Report};

const COLORS: [RGBColor; 6] = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];

/// Draws an empirical CDF per series into `path`.
fn cdf(path: &Path, title: &str, x_label: &str, series: &[(String, Vec<f64>)]) -> Result<()> {
    let fail =
        |e: &dyn std::fmt::Display| Error::Failed(format!("drawing {}: {e}", path.display()));
    let x_max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.05;
    let root = SVGBackend::new(path, (720, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("fraction of flows")
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (name, values)) in series.iter().enumerate() {
        let mut v = values.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len().max(1) as f64;
        // A step function: each flow raises the curve by 1/n at its value.
        let mut points = vec![(0.0, 0.0)];
        for (k, x) in v.iter().enumerate() {
            points.push((*x, k as f64 / n));
            points.push((*x, (k + 1) as f64 / n));
        }
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| fail(&e))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// Draws one line per series of (x, y) points into `path` (y from 0).
pub fn lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let fail =
        |e: &dyn std::fmt::Display| Error::Failed(format!("drawing {}: {e}", path.display()));
    let points = || series.iter().flat_map(|(_, v)| v.iter().copied());
    let x_min = points().map(|p| p.0).fold(f64::MAX, f64::min).min(0.0);
    let x_max = points()
        .map(|p| p.0)
        .fold(f64::MIN, f64::max)
        .max(x_min + 1e-9);
    let y_max = points().map(|p| p.1).fold(0.0f64, f64::max).max(1e-9) * 1.1;
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_min..x_max, 0.0..y_max)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (name, values)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(values.clone(), color.stroke_width(2)))
            .map_err(|e| fail(&e))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// Draws grouped bars: one group per label, one bar per series.
fn bars(
    path: &Path,
    title: &str,
    y_label: &str,
    labels: &[String],
    series: &[(String, Vec<f64>)],
) -> Result<()> {
    let fail =
        |e: &dyn std::fmt::Display| Error::Failed(format!("drawing {}: {e}", path.display()));
    let y_max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let n = labels.len().max(1);
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        // Group k is centred on x = k, so the integer ticks name the groups.
        .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..y_max)
        .map_err(|e| fail(&e))?;
    let names = labels.to_vec();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n + 1)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() > 1e-6 || *x < 0.0 {
                return String::new();
            }
            names.get(x.round() as usize).cloned().unwrap_or_default()
        })
        .x_desc("core link")
        .y_desc(y_label)
        .draw()
        .map_err(|e| fail(&e))?;
    let width = 0.8 / series.len().max(1) as f64;
    for (i, (name, values)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(values.iter().enumerate().map(|(k, v)| {
                let x0 = k as f64 - 0.4 + i as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width, *v)], color.filled())
            }))
            .map_err(|e| fail(&e))?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// Writes `<name>-throughput-cdf.svg`, `<name>-fct-cdf.svg` and `<name>-packets-per-path.svg`
/// into `dir`; returns their paths.
pub fn write(report: &Report, dir: &Path, name: &str) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let throughput: Vec<(String, Vec<f64>)> = report
        .results
        .iter()
        .map(|r| {
            (
                r.mode.clone(),
                r.per_flow.iter().map(|f| f.2 / report.rate_mbit).collect(),
            )
        })
        .collect();
    let fct: Vec<(String, Vec<f64>)> = report
        .results
        .iter()
        .map(|r| (r.mode.clone(), r.per_flow.iter().map(|f| f.3).collect()))
        .collect();
    let paths = vec![
        dir.join(format!("{name}-throughput-cdf.svg")),
        dir.join(format!("{name}-fct-cdf.svg")),
    ];
    cdf(
        &paths[0],
        &format!("{name}: per-flow throughput"),
        "throughput / link rate",
        &throughput,
    )?;
    cdf(
        &paths[1],
        &format!("{name}: flow completion time"),
        "seconds",
        &fct,
    )?;
    let mut paths = paths;
    if let Some(first) = report.results.iter().find(|r| !r.core_links.is_empty()) {
        let labels: Vec<String> = first.core_links.iter().map(|(n, _)| n.clone()).collect();
        let series: Vec<(String, Vec<f64>)> = report
            .results
            .iter()
            .map(|r| {
                (
                    r.mode.clone(),
                    r.core_links.iter().map(|(_, b)| *b as f64 / 1e6).collect(),
                )
            })
            .collect();
        let path = dir.join(format!("{name}-packets-per-path.svg"));
        bars(
            &path,
            &format!("{name}: bytes on each core link, per mode"),
            "MB sent upward",
            &labels,
            &series,
        )?;
        paths.push(path);
    }
    Ok(paths)
}
