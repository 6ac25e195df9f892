//! Figures of an experiment's report, as SVG: the CDF of per-flow throughput (the SOPA paper's
//! Fig. 11) and of flow completion times, one line per mode.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::{Error, Result, experiment::Report};

/// Each mode's own colour, the same in every figure (the ideal black); a mode's variants
/// (`sopa+cell4`, `ecmp+r3`) and unknown names take the next colour of [`SPARE`] no series of
/// the figure has.
const MODE_COLOURS: [(&str, RGBColor); 8] = [
    ("ideal", RGBColor(0, 0, 0)),
    ("sopa", RGBColor(31, 119, 180)),
    ("rps", RGBColor(214, 39, 40)),
    ("ecmp", RGBColor(44, 160, 44)),
    ("hedera", RGBColor(148, 103, 189)),
    ("single", RGBColor(255, 127, 14)),
    ("random", RGBColor(23, 190, 207)),
    ("rr-blind", RGBColor(140, 86, 75)),
];

/// Colours for series beyond the modes' own, each apart from them and from each other.
const SPARE: [RGBColor; 8] = [
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
    RGBColor(0, 70, 140),
    RGBColor(160, 0, 0),
    RGBColor(0, 100, 0),
    RGBColor(255, 187, 120),
    RGBColor(174, 199, 232),
];

/// One colour per series, never two alike in one figure.
fn colours(names: &[&str]) -> Vec<RGBColor> {
    let mut taken: Vec<RGBColor> = Vec::new();
    let own = |n: &str| MODE_COLOURS.iter().find(|(m, _)| *m == n).map(|(_, c)| *c);
    // The plain modes first, so a variant never takes its mode's colour.
    let mut out: Vec<Option<RGBColor>> = names.iter().map(|n| own(n)).collect();
    for c in out.iter().flatten() {
        taken.push(*c);
    }
    let mut spare = MODE_COLOURS
        .iter()
        .map(|(_, c)| *c)
        .chain(SPARE)
        .filter(|c| !taken.contains(c))
        .collect::<Vec<_>>()
        .into_iter();
    for c in out.iter_mut().filter(|c| c.is_none()) {
        *c = Some(spare.next().unwrap_or(RGBColor(90, 90, 90)));
    }
    out.into_iter()
        .map(|c| c.expect("every series coloured"))
        .collect()
}

/// A range that holds `values` with a margin of 3% of their span on each side (from 0 when
/// `from_zero`): the axes fit the data.
fn span(values: impl Iterator<Item = f64> + Clone, from_zero: bool) -> (f64, f64) {
    let lo = values.clone().fold(f64::MAX, f64::min);
    let hi = values.fold(f64::MIN, f64::max);
    if lo > hi {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.03).max(hi.abs() * 1e-3).max(1e-9);
    let lo = if from_zero {
        0.0
    } else {
        (lo - pad).max(if lo >= 0.0 { 0.0 } else { f64::MIN })
    };
    (lo, hi + pad)
}

/// The corner of the plot where the legend covers the fewest data points: the points in a box
/// of 40% of the width and 35% of the height at each corner are counted, and the emptiest
/// corner wins (the lower right on a tie).
fn legend_corner(points: &[(f64, f64)], x: (f64, f64), y: (f64, f64)) -> SeriesLabelPosition {
    let fx = |v: f64| (v - x.0) / (x.1 - x.0).max(1e-12);
    let fy = |v: f64| (v - y.0) / (y.1 - y.0).max(1e-12);
    let corners = [
        (SeriesLabelPosition::LowerRight, true, false),
        (SeriesLabelPosition::UpperLeft, false, true),
        (SeriesLabelPosition::UpperRight, true, true),
        (SeriesLabelPosition::LowerLeft, false, false),
    ];
    let count = |right: bool, upper: bool| {
        points
            .iter()
            .filter(|(px, py)| {
                let (u, v) = (fx(*px), fy(*py));
                (if right { u >= 0.6 } else { u <= 0.4 })
                    && (if upper { v >= 0.65 } else { v <= 0.35 })
            })
            .count()
    };
    corners
        .into_iter()
        .min_by_key(|(_, right, upper)| count(*right, *upper))
        .map(|(p, _, _)| p)
        .expect("four corners")
}

/// The points of a step-function CDF of `values` from `x0`: each value raises it by 1/n.
fn cdf_points(values: &[f64], x0: f64) -> Vec<(f64, f64)> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len().max(1) as f64;
    let mut points = vec![(x0, 0.0)];
    for (k, x) in v.iter().enumerate() {
        points.push((*x, k as f64 / n));
        points.push((*x, (k + 1) as f64 / n));
    }
    points
}

/// Draws an empirical CDF per series into `path`.
fn cdf(path: &Path, title: &str, x_label: &str, series: &[(String, Vec<f64>)]) -> Result<()> {
    let fail =
        |e: &dyn std::fmt::Display| Error::Failed(format!("drawing {}: {e}", path.display()));
    let (x_lo, x_hi) = span(series.iter().flat_map(|(_, v)| v.iter().copied()), false);
    let curves: Vec<Vec<(f64, f64)>> = series.iter().map(|(_, v)| cdf_points(v, x_lo)).collect();
    let all: Vec<(f64, f64)> = curves.iter().flatten().copied().collect();
    let corner = legend_corner(&all, (x_lo, x_hi), (0.0, 1.0));
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    let palette = colours(&names);
    let root = SVGBackend::new(path, (720, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(x_lo..x_hi, 0.0..1.0)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("fraction of flows")
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, ((name, _), points)) in series.iter().zip(curves).enumerate() {
        let color = palette[i];
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
        .position(corner)
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
    let (x_min, x_max) = span(points().map(|p| p.0), false);
    let (_, y_max) = span(points().map(|p| p.1), true);
    let all: Vec<(f64, f64)> = points().collect();
    let corner = legend_corner(&all, (x_min, x_max), (0.0, y_max));
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    let palette = colours(&names);
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
        let color = palette[i];
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
        .position(corner)
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
        // Room above the bars for the legend.
        * 1.35;
    let n = labels.len().max(1);
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    let palette = colours(&names);
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
        let color = palette[i];
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
        // Modes without core links have no bars, nor a legend entry.
        let series: Vec<(String, Vec<f64>)> = report
            .results
            .iter()
            .filter(|r| !r.core_links.is_empty())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_of_a_figure_has_its_own_colour_and_each_mode_always_the_same() {
        let names = [
            "ideal",
            "sopa",
            "sopa+cell2",
            "sopa+cell4",
            "sopa+cell8",
            "sopa+cell16",
            "sopa+cell44",
            "rps",
            "ecmp",
            "hedera",
        ];
        let c = colours(&names);
        for i in 0..c.len() {
            for j in 0..i {
                assert_ne!(c[i], c[j], "{} and {} share a colour", names[i], names[j]);
            }
        }
        assert_eq!(c[0], RGBColor(0, 0, 0), "the ideal is black");
        assert_eq!(
            colours(&["ecmp", "sopa"])[1],
            c[1],
            "sopa's colour in every figure"
        );
    }

    #[test]
    fn axes_fit_the_data_and_the_legend_takes_the_emptiest_corner() {
        let (lo, hi) = span([0.29, 0.5, 0.93].into_iter(), false);
        assert!(
            lo > 0.25 && lo < 0.29 && hi > 0.93 && hi < 0.97,
            "{lo} {hi}"
        );
        // Throughput CDFs rise at the right: the legend goes left.
        let points = cdf_points(&[0.8, 0.85, 0.9, 0.92], 0.0);
        let corner = legend_corner(&points, (0.0, 1.0), (0.0, 1.0));
        assert!(
            matches!(
                corner,
                SeriesLabelPosition::UpperLeft | SeriesLabelPosition::LowerLeft
            ),
            "{corner:?}"
        );
        // FCT CDFs rise at the left: the lower right is clear.
        let points = cdf_points(&[0.1, 0.2, 0.3, 5.0], 0.0);
        let corner = legend_corner(&points, (0.0, 5.0), (0.0, 1.0));
        assert!(
            matches!(corner, SeriesLabelPosition::LowerRight),
            "{corner:?}"
        );
    }
}
