//! The demos' charts, drawn with `plotters` as SVG and PNG: lines over an x axis (rounds, or
//! optimizer steps), one panel per tenant or one for all, points where values were measured,
//! and ticks along the bottom where adapter versions went live. Text needs a TrueType font,
//! read once at run time (DejaVu Sans from Debian's `fonts-dejavu-core`, or `CLAWBACK_FONT`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// A chart: its panels side by side, sharing the axes' meaning and range.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub y_range: (f64, f64),
    pub panels: Vec<Panel>,
    /// What the ticks along the bottom mean.
    pub marks_label: String,
}

#[derive(Debug, Clone)]
pub struct Panel {
    pub title: Option<String>,
    pub lines: Vec<Line>,
    /// x positions marked by a tick along the bottom (versions going live).
    pub marks: Vec<f64>,
}

#[derive(Debug, Clone)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

const COLOURS: [RGBColor; 4] = [
    RGBColor(0xd9, 0x48, 0x0f),
    RGBColor(0x19, 0x71, 0xc2),
    RGBColor(0x2f, 0x9e, 0x44),
    RGBColor(0x86, 0x2e, 0x9c),
];
const PANEL_WIDTH: u32 = 640;
const HEIGHT: u32 = 460;

/// `+0.42`, or `n/a`.
pub fn signed(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:+.2}"))
}

/// Writes `<base>.svg` and `<base>.png`; the paths written.
pub fn write(chart: &Chart, base: &Path) -> Result<Vec<String>> {
    font()?;
    let size = (PANEL_WIDTH * chart.panels.len().max(1) as u32, HEIGHT);
    let svg = base.with_extension("svg");
    draw(SVGBackend::new(&svg, size).into_drawing_area(), chart)
        .with_context(|| format!("drawing {}", svg.display()))?;
    let png = base.with_extension("png");
    draw(BitMapBackend::new(&png, size).into_drawing_area(), chart)
        .with_context(|| format!("drawing {}", png.display()))?;
    Ok([svg, png].iter().map(|p| p.display().to_string()).collect())
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, chart: &Chart) -> Result<()> {
    let fail = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("{e:?}");
    root.fill(&WHITE).map_err(fail)?;
    let root = root
        .titled(
            &chart.title,
            ("sans-serif", 18).into_font().style(FontStyle::Bold),
        )
        .map_err(fail)?;
    let (y0, y1) = chart.y_range;
    let x_end = chart
        .panels
        .iter()
        .flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)))
        .chain(chart.panels.iter().flat_map(|p| p.marks.iter().copied()))
        .fold(1.0_f64, f64::max);
    let areas = root.split_evenly((1, chart.panels.len().max(1)));
    for (area, panel) in areas.iter().zip(&chart.panels) {
        let mut builder = ChartBuilder::on(area);
        builder
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50);
        if let Some(title) = &panel.title {
            builder.caption(title, ("sans-serif", 15));
        }
        let mut plot = builder
            .build_cartesian_2d(0.0..x_end, y0..y1)
            .map_err(fail)?;
        plot.configure_mesh()
            .x_desc(chart.x_label.as_str())
            .y_desc(chart.y_label.as_str())
            // One label per step on short runs (more would repeat a rounded step).
            .x_labels((x_end.ceil() as usize + 1).min(11))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.1}"))
            .max_light_lines(1)
            .light_line_style(RGBColor(0xf1, 0xf3, 0xf5))
            .draw()
            .map_err(fail)?;
        for (index, line) in panel.lines.iter().enumerate() {
            let colour = COLOURS[index % COLOURS.len()];
            plot.draw_series(LineSeries::new(
                line.points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(fail)?
            .label(line.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
            });
            plot.draw_series(
                line.points
                    .iter()
                    .map(|&point| Circle::new(point, 3, colour.filled())),
            )
            .map_err(fail)?;
        }
        let tick = (y1 - y0) * 0.04;
        let grey = RGBColor(0x49, 0x50, 0x57);
        plot.draw_series(
            panel
                .marks
                .iter()
                .map(|&x| PathElement::new(vec![(x, y0), (x, y0 + tick)], grey.stroke_width(2))),
        )
        .map_err(fail)?
        .label(chart.marks_label.as_str())
        .legend(move |(x, y)| {
            PathElement::new(vec![(x + 10, y - 5), (x + 10, y + 5)], grey.stroke_width(2))
        });
        plot.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0xad, 0xb5, 0xbd))
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(fail)?;
    }
    root.present().map_err(fail)?;
    Ok(())
}

/// Registers the TrueType font the charts' text is laid out and drawn with (once).
fn font() -> Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            let path = font_path().ok_or_else(|| {
                "no TrueType font for the charts: install fonts-dejavu-core (Debian) or set \
                 CLAWBACK_FONT to a .ttf file"
                    .to_owned()
            })?;
            let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            for style in [FontStyle::Normal, FontStyle::Bold] {
                plotters::style::register_font("sans-serif", style, bytes)
                    .map_err(|_| format!("{}: not a TrueType font", path.display()))?;
            }
            Ok(())
        })
        .clone()
        .map_err(|e| anyhow!(e))
}

fn font_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CLAWBACK_FONT") {
        return Some(PathBuf::from(path));
    }
    const KNOWN: [&str; 3] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    KNOWN.iter().map(PathBuf::from).find(|p| p.is_file())
}
