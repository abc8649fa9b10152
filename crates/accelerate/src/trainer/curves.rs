//! `output_dir/curves.svg`, written at the end of a run next to `log.jsonl`: the log history
//! as line charts over the optimizer steps, one panel each for the losses (training and
//! evaluation), the other evaluation metrics and the throughput (samples/s). Plain SVG, no
//! plotting dependency; a panel with no points is left out.

use std::fmt::Write as _;
use std::path::Path;

use super::LogEntry;
use crate::AccelerateError;

/// The chart file's name in `output_dir`.
pub(crate) const CURVES_FILE: &str = "curves.svg";

const WIDTH: f64 = 760.0;
const PANEL_H: f64 = 220.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const COLOURS: [&str; 6] = [
    "#4a7bd0", "#d0584a", "#3a9a5b", "#a35bc4", "#d09a2a", "#555555",
];

/// One line: its name and (step, value) points.
type Series = (String, Vec<(f64, f64)>);

/// Writes the chart of `history` to `dir/curves.svg` (temp file, then rename).
pub(crate) fn write_curves(dir: &Path, history: &[LogEntry]) -> Result<(), AccelerateError> {
    let svg = svg(history);
    let path = dir.join(CURVES_FILE);
    let tmp = dir.join(format!("{CURVES_FILE}.tmp"));
    std::fs::write(&tmp, svg).map_err(|e| AccelerateError::io("write curves", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| AccelerateError::io("write curves", &path, e))
}

/// The panels of `history` as one SVG document.
pub(crate) fn svg(history: &[LogEntry]) -> String {
    let series = |keep: &dyn Fn(&str) -> bool| -> Vec<Series> {
        let mut out: Vec<Series> = Vec::new();
        for entry in history {
            for (name, value) in &entry.values.0 {
                if !keep(name) || !value.is_finite() {
                    continue;
                }
                let point = (entry.step as f64, *value);
                match out.iter_mut().find(|(n, _)| n == name) {
                    Some((_, points)) => points.push(point),
                    None => out.push((name.clone(), vec![point])),
                }
            }
        }
        out
    };
    let panels = [
        ("loss", series(&|n| n == "loss" || n == "eval_loss")),
        (
            "evaluation",
            series(&|n| n.starts_with("eval_") && n != "eval_loss" && !is_eval_timing(n)),
        ),
        ("samples/s", series(&|n| n == "samples_per_second")),
    ];
    let panels: Vec<_> = panels.into_iter().filter(|(_, s)| !s.is_empty()).collect();
    let height = 10.0 + PANEL_H * panels.len().max(1) as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (i, (title, lines)) in panels.iter().enumerate() {
        panel(&mut svg, 10.0 + PANEL_H * i as f64, title, lines);
    }
    svg.push_str("</svg>\n");
    svg
}

/// HF's evaluation timings (`eval_runtime`, `eval_samples_per_second`, ...): not curves of
/// the model.
fn is_eval_timing(name: &str) -> bool {
    name.ends_with("_runtime") || name.ends_with("_per_second")
}

/// One panel at `top`: axes with their ranges, a polyline and a legend entry per series.
fn panel(svg: &mut String, top: f64, title: &str, lines: &[Series]) {
    let (plot_top, plot_h) = (top + 24.0, PANEL_H - 60.0);
    let plot_w = WIDTH - LEFT - RIGHT;
    let points = lines.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        (y0, y1) = (y0 - 0.5, y1 + 0.5);
    }
    let px = |x: f64| LEFT + (x - x0) / (x1 - x0) * plot_w;
    let py = |y: f64| plot_top + plot_h - (y - y0) / (y1 - y0) * plot_h;
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"{:.0}\" font-size=\"14\" font-weight=\"bold\">{}</text>\n\
         <rect x=\"{LEFT}\" y=\"{plot_top:.0}\" width=\"{plot_w:.0}\" height=\"{plot_h:.0}\" \
         fill=\"none\" stroke=\"#999\"/>\n\
         <text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\n\
         <text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\n\
         <text x=\"{LEFT}\" y=\"{:.0}\">step {x0:.0}</text>\n\
         <text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">step {x1:.0}</text>\n",
        top + 16.0,
        escape(title),
        LEFT - 6.0,
        plot_top + 10.0,
        number(y1),
        LEFT - 6.0,
        plot_top + plot_h,
        number(y0),
        plot_top + plot_h + 16.0,
        LEFT + plot_w,
        plot_top + plot_h + 16.0,
    );
    for (k, (name, points)) in lines.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let coords: Vec<String> = points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            coords.join(" ")
        );
        if let [(x, y)] = points.as_slice() {
            let _ = writeln!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>",
                px(*x),
                py(*y)
            );
        }
        let ly = plot_top + 14.0 + 16.0 * k as f64;
        let _ = write!(
            svg,
            "<rect x=\"{:.0}\" y=\"{:.0}\" width=\"12\" height=\"3\" fill=\"{colour}\"/>\n\
             <text x=\"{:.0}\" y=\"{ly:.0}\">{}</text>\n",
            LEFT + plot_w + 10.0,
            ly - 5.0,
            LEFT + plot_w + 28.0,
            escape(name)
        );
    }
}

/// A value with about three significant digits.
fn number(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        a if a >= 1.0 => format!("{v:.2}"),
        a if a >= 0.001 || a == 0.0 => format!("{v:.3}"),
        _ => format!("{v:.2e}"),
    }
}

/// Text safe inside SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trainer::Metrics;

    fn entry(step: u64, values: &[(&str, f64)]) -> LogEntry {
        let mut metrics = Metrics::default();
        for (name, value) in values {
            metrics.insert(*name, *value);
        }
        LogEntry {
            step,
            epoch: step as f64 / 10.0,
            values: metrics,
        }
    }

    #[test]
    fn each_series_is_a_line_in_its_panel() {
        let history = [
            entry(2, &[("loss", 2.5), ("samples_per_second", 300.0)]),
            entry(4, &[("loss", 2.0), ("samples_per_second", 320.0)]),
            entry(
                4,
                &[
                    ("eval_loss", 2.2),
                    ("eval_accuracy", 0.4),
                    ("eval_runtime", 0.1),
                ],
            ),
            entry(6, &[("loss", 1.5), ("samples_per_second", 310.0)]),
        ];
        let svg = svg(&history);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        for title in [">loss<", ">evaluation<", ">samples/s<"] {
            assert!(svg.contains(title), "{title}");
        }
        // loss, eval_loss (one point: a dot too), eval_accuracy, samples_per_second.
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(!svg.contains("eval_runtime"));
        // The loss line runs over steps 2..6: its first point at the left edge, its last at
        // the right.
        let left = format!("{LEFT:.1},");
        assert!(svg.contains(&format!("points=\"{left}")), "{svg}");
        assert!(
            svg.contains(">step 2<") && svg.contains(">step 6<"),
            "{svg}"
        );
        // A history without throughput or evaluations draws the loss panel alone.
        let only_loss = super::svg(&[entry(1, &[("loss", 1.0)]), entry(2, &[("loss", 0.5)])]);
        assert_eq!(only_loss.matches("font-weight=\"bold\"").count(), 1);
    }
}
