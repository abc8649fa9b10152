//! SVG bar charts of a suite's figures (written next to its JSON and markdown, embedded in
//! docs/benchmarks.md). Plain SVG, no plotting dependency: one horizontal bar per scenario.

use std::fmt::Write as _;

/// One chart: a title, the unit of the values, and a labelled bar per scenario.
#[derive(Clone)]
pub struct Chart {
    /// File name part: `<suite>-<backend>-<name>.svg`.
    pub name: String,
    pub title: String,
    pub unit: String,
    pub bars: Vec<(String, f64)>,
}

impl Chart {
    /// A chart of `bars`, skipping values that are not finite.
    pub fn new(name: &str, title: &str, unit: &str, bars: Vec<(String, f64)>) -> Chart {
        Chart {
            name: name.into(),
            title: title.into(),
            unit: unit.into(),
            bars: bars.into_iter().filter(|(_, v)| v.is_finite()).collect(),
        }
    }

    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        const LABEL_W: f64 = 330.0;
        const BAR_W: f64 = 360.0;
        const ROW_H: f64 = 22.0;
        const TOP: f64 = 34.0;
        let width = LABEL_W + BAR_W + 110.0;
        let height = TOP + ROW_H * self.bars.len() as f64 + 12.0;
        let max = self.bars.iter().map(|(_, v)| v.abs()).fold(0.0, f64::max);
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"8\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{} ({})</text>\n",
            escape(&self.title),
            escape(&self.unit)
        );
        for (i, (label, value)) in self.bars.iter().enumerate() {
            let y = TOP + ROW_H * i as f64;
            let w = if max > 0.0 {
                BAR_W * value.abs() / max
            } else {
                0.0
            };
            let _ = write!(
                svg,
                "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\n\
                 <rect x=\"{LABEL_W}\" y=\"{:.0}\" width=\"{w:.1}\" height=\"{:.0}\" fill=\"#4a7bd0\"/>\n\
                 <text x=\"{:.0}\" y=\"{:.0}\">{}</text>\n",
                LABEL_W - 8.0,
                y + 15.0,
                escape(label),
                y + 3.0,
                ROW_H - 6.0,
                LABEL_W + w + 6.0,
                y + 15.0,
                number(*value)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// A value with about three significant digits.
fn number(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        a if a >= 1.0 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_and_labels_are_escaped() {
        let chart = Chart::new(
            "t",
            "steps <per> s",
            "1/s",
            vec![
                ("a & b".into(), 2.0),
                ("c".into(), 1.0),
                ("nan".into(), f64::NAN),
            ],
        );
        let svg = chart.svg();
        assert!(
            svg.contains("width=\"360.0\"") && svg.contains("width=\"180.0\""),
            "{svg}"
        );
        assert!(svg.contains("a &amp; b") && svg.contains("steps &lt;per&gt; s"));
        assert!(!svg.contains(">nan<"), "non-finite values are left out");
    }
}
