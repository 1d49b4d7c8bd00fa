//! Line charts (PNG and SVG) for sweeps, drawn with plotters and a bundled font, so no
//! system font library or python is needed.

use std::path::Path;
use std::sync::Once;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::prelude::*;
use plotters::style::FontStyle;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// One line chart: named series of (x, y) points.
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// A logarithmic x axis (batch sizes, task counts); else linear (time).
    pub log_x: bool,
    pub log_y: bool,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            tracing::warn!("cannot load the bundled chart font; PNG labels may be missing");
        }
    });
}

impl LineChart {
    /// Writes `stem.png` and `stem.svg`.
    pub fn write(&self, stem: &Path) -> anyhow::Result<()> {
        register_font();
        let png = stem.with_extension("png");
        self.render(BitMapBackend::new(&png, (960, 600)).into_drawing_area())?;
        let svg = stem.with_extension("svg");
        self.render(SVGBackend::new(&svg, (960, 600)).into_drawing_area())?;
        Ok(())
    }

    fn bounds(&self) -> ((f64, f64), (f64, f64)) {
        let points = self.series.iter().flat_map(|(_, p)| p.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in points {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            return ((1.0, 10.0), (1.0, 10.0));
        }
        let x = if self.log_x {
            (x0.max(1e-9) / 1.5, x1 * 1.5)
        } else {
            (x0.min(0.0), x1.max(x0 + 1.0))
        };
        let y = if self.log_y {
            (y0.max(1e-9) / 2.0, y1 * 2.0)
        } else {
            (0.0, (y1 * 1.1).max(1.0))
        };
        (x, y)
    }

    fn render<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> anyhow::Result<()> {
        let err = |e: &dyn std::fmt::Display| anyhow!("cannot draw {}: {e}", self.title);
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let ((x0, x1), (y0, y1)) = self.bounds();
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(&self.title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(90);
        match (self.log_x, self.log_y) {
            (true, true) => {
                let chart = builder
                    .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())
                    .map_err(|e| err(&e))?;
                self.draw(chart).map_err(|e| err(&e))?;
            }
            (true, false) => {
                let chart = builder
                    .build_cartesian_2d((x0..x1).log_scale(), y0..y1)
                    .map_err(|e| err(&e))?;
                self.draw(chart).map_err(|e| err(&e))?;
            }
            (false, true) => {
                let chart = builder
                    .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
                    .map_err(|e| err(&e))?;
                self.draw(chart).map_err(|e| err(&e))?;
            }
            (false, false) => {
                let chart = builder.build_cartesian_2d(x0..x1, y0..y1).map_err(|e| err(&e))?;
                self.draw(chart).map_err(|e| err(&e))?;
            }
        }
        root.present().map_err(|e| err(&e))?;
        Ok(())
    }

    fn draw<'a, DB, X, Y>(
        &self,
        mut chart: ChartContext<'a, DB, Cartesian2d<X, Y>>,
    ) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
    where
        DB: DrawingBackend + 'a,
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_label_formatter(&|v| short(*v))
            .y_label_formatter(&|v| short(*v))
            .label_style(("sans-serif", 15))
            .draw()?;
        for (i, (name, points)) in self.series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        Ok(())
    }
}

/// Axis labels like 1, 64, 8k, 1.2M.
fn short(v: f64) -> String {
    kvshared::units::si(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_non_empty_png_and_svg() {
        let dir = kvtestkit::scratch("kvbench-chart");
        for (log_x, log_y) in [(true, false), (true, true), (false, true), (false, false)] {
            let chart = LineChart {
                title: "throughput vs batch".into(),
                x_label: "batch".into(),
                y_label: "op/s".into(),
                log_x,
                log_y,
                series: vec![
                    ("8 tasks".into(), vec![(1.0, 1e4), (64.0, 5e5), (8192.0, 2e6)]),
                    ("128 tasks".into(), vec![(1.0, 5e4), (64.0, 9e5), (8192.0, 3e6)]),
                ],
            };
            let stem = dir.join(format!("chart-{log_x}-{log_y}"));
            chart.write(&stem).unwrap();
            assert!(std::fs::metadata(stem.with_extension("png")).unwrap().len() > 5_000);
            assert!(std::fs::metadata(stem.with_extension("svg")).unwrap().len() > 1_000);
        }
    }
}
