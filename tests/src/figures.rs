//! Figures of an experiment's report, as SVG: the CDF of per-flow throughput (the SOPA paper's
//! Fig. 11) and of flow completion times, one line per mode.

use std::path::{Path, PathBuf};

use plotters::{coord::Shift, prelude::*};

use crate::{Error, Result, experiment::Report};

/// Each mode's own colour, the same in every figure (the ideal black, and nothing else); a
/// mode's variants (`sopa+cell4`, `ecmp+r3`) and unknown names take the next colour no series
/// of the figure has, of the other modes' and then of [`SPARE`].
const MODE_COLOURS: [(&str, RGBColor); 9] = [
    ("ideal", RGBColor(0, 0, 0)),
    ("sopa", RGBColor(31, 119, 180)),
    ("rps", RGBColor(214, 39, 40)),
    ("ecmp", RGBColor(44, 160, 44)),
    ("hedera", RGBColor(148, 103, 189)),
    ("single", RGBColor(255, 127, 14)),
    ("random", RGBColor(23, 190, 207)),
    ("rr-blind", RGBColor(140, 86, 75)),
    ("mptcp", RGBColor(227, 119, 194)),
];

/// Colours for series beyond the modes' own, each apart from them and from each other.
const SPARE: [RGBColor; 7] = [
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
        .filter(|(m, _)| *m != "ideal")
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

/// The width of the strip right of a line plot that holds its legend (no curve runs under it,
/// wherever the data lie): room for the sample and the longest name, about 8 px a character at
/// 14 px.
fn legend_width(names: &[&str]) -> u32 {
    let longest = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) as u32;
    (44 + 8 * longest).max(100)
}

/// Splits `root` into the plot and the legend's strip, `strip` pixels wide, at its right.
fn with_legend_strip<'a>(
    root: &DrawingArea<SVGBackend<'a>, Shift>,
    strip: u32,
) -> (
    DrawingArea<SVGBackend<'a>, Shift>,
    DrawingArea<SVGBackend<'a>, Shift>,
) {
    let (width, _) = root.dim_in_pixel();
    root.split_horizontally(width.saturating_sub(strip))
}

/// The legend in its strip: a line sample and the name per series, from the top of the plot.
fn legend(
    strip: &DrawingArea<SVGBackend<'_>, Shift>,
    names: &[&str],
    palette: &[RGBColor],
) -> std::result::Result<(), String> {
    for (i, (name, color)) in names.iter().zip(palette).enumerate() {
        let y = 56 + 22 * i as i32;
        strip
            .draw(&PathElement::new(
                vec![(4, y), (28, y)],
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
        strip
            .draw(&Text::new(
                name.to_string(),
                (34, y - 7),
                ("sans-serif", 14).into_font(),
            ))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
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
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    let palette = colours(&names);
    let strip_width = legend_width(&names);
    let root = SVGBackend::new(path, (720 + strip_width, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (plot, strip) = with_legend_strip(&root, strip_width);
    let mut chart = ChartBuilder::on(&plot)
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
    for (points, color) in curves.into_iter().zip(&palette) {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| fail(&e))?;
    }
    legend(&strip, &names, &palette).map_err(|e| fail(&e))?;
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
    let names: Vec<&str> = series.iter().map(|(n, _)| n.as_str()).collect();
    let palette = colours(&names);
    let strip_width = legend_width(&names);
    let root = SVGBackend::new(path, (960 + strip_width, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (plot, strip) = with_legend_strip(&root, strip_width);
    let mut chart = ChartBuilder::on(&plot)
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
    for ((_, values), color) in series.iter().zip(&palette) {
        chart
            .draw_series(LineSeries::new(values.clone(), color.stroke_width(2)))
            .map_err(|e| fail(&e))?;
    }
    legend(&strip, &names, &palette).map_err(|e| fail(&e))?;
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
        // Modes without core links have no bars, nor a legend entry: the ideal runs on one big
        // switch, and what it lists for the fabric's core links is the fabric's own control
        // traffic meanwhile (a packet or two). A mode whose core links carried nothing keeps
        // its (empty) bars: that is a result.
        let series: Vec<(String, Vec<f64>)> = report
            .results
            .iter()
            .filter(|r| r.mode != "ideal" && !r.core_links.is_empty())
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
        // And nothing else is, whatever the figure holds.
        let others = [
            "sopa",
            "mptcp",
            "sopa+cell4",
            "throughput, 10 Mbit/s",
            "x",
            "y",
            "z",
        ];
        assert!(
            !colours(&others).contains(&RGBColor(0, 0, 0)),
            "{:?}",
            colours(&others)
        );
        assert_eq!(
            colours(&["ecmp", "sopa"])[1],
            c[1],
            "sopa's colour in every figure"
        );
    }

    #[test]
    fn axes_fit_the_data() {
        let (lo, hi) = span([0.29, 0.5, 0.93].into_iter(), false);
        assert!(
            lo > 0.25 && lo < 0.29 && hi > 0.93 && hi < 0.97,
            "{lo} {hi}"
        );
    }

    /// The x coordinates of an SVG's polylines' points, and of each text's anchor by its text.
    fn svg_xs(svg: &str) -> (Vec<f64>, Vec<(String, f64)>) {
        let attr = |tag: &str, name: &str| {
            tag.split(&format!(" {name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .map(str::to_owned)
        };
        let mut lines = Vec::new();
        let mut texts = Vec::new();
        for tag in svg.split('<').skip(1) {
            if tag.starts_with("polyline") {
                for p in attr(tag, "points").unwrap_or_default().split_whitespace() {
                    lines.push(p.split(',').next().unwrap().parse().unwrap());
                }
            } else if tag.starts_with("text") {
                let x = attr(tag, "x").unwrap().parse().unwrap();
                let body = tag.split_once('>').map_or("", |(_, b)| b).trim().to_owned();
                texts.push((body, x));
            }
        }
        (lines, texts)
    }

    #[test]
    fn the_legend_stands_right_of_every_curve() {
        let dir = std::env::temp_dir().join(crate::run_name("figures"));
        std::fs::create_dir_all(&dir).unwrap();
        // Curves that fill every corner of the plot.
        let series = vec![
            ("sopa".to_owned(), vec![0.1, 0.2, 0.9, 0.95]),
            ("ecmp".to_owned(), vec![0.1, 0.5, 0.6, 0.95]),
        ];
        let cdf_file = dir.join("cdf.svg");
        cdf(&cdf_file, "t", "x", &series).unwrap();
        let line_file = dir.join("lines.svg");
        let wide: Vec<(String, Vec<(f64, f64)>)> = series
            .iter()
            .map(|(n, v)| {
                (
                    n.clone(),
                    v.iter().enumerate().map(|(i, y)| (i as f64, *y)).collect(),
                )
            })
            .collect();
        lines(&line_file, "t", "x", "y", &wide).unwrap();
        for file in [cdf_file, line_file] {
            let svg = std::fs::read_to_string(&file).unwrap();
            let (curves, texts) = svg_xs(&svg);
            let right = curves.iter().copied().fold(f64::MIN, f64::max);
            assert!(!curves.is_empty(), "{svg}");
            for name in ["sopa", "ecmp"] {
                let (_, x) = texts
                    .iter()
                    .find(|(t, _)| t == name)
                    .unwrap_or_else(|| panic!("no legend entry {name} in {}", file.display()));
                assert!(
                    *x > right,
                    "{name}'s legend at x={x}, a curve reaches x={right}"
                );
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
