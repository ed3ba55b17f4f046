//! The reward curve as a standalone SVG: each tenant's mean plugin reward per round, on one
//! axis from −1 to 1, with the baseline and the last rounds' means as dashed lines.

use std::fmt::Write as _;

use super::summary::Summary;

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 4] = ["#d9480f", "#1971c2", "#2f9e44", "#862e9c"];

/// Text safe inside SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn svg(summary: &Summary) -> String {
    let rounds = f64::from(summary.rounds.max(2) - 1);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |round: f64| LEFT + plot_w * round / rounds;
    let y = |reward: f64| TOP + plot_h * (1.0 - (reward.clamp(-1.0, 1.0) + 1.0) / 2.0);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="28" font-size="16" font-weight="bold">clawback demo: mean reward per round, each tenant by its own preference</text>"#
    );
    for tick in [-1.0, -0.5, 0.0, 0.5, 1.0] {
        let ty = y(tick);
        let dash = if tick == 0.0 {
            ""
        } else {
            r#" stroke-dasharray="2,3""#
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#ced4da"{dash}/><text x="{:.1}" y="{:.1}" text-anchor="end">{tick:+.1}</text>"##,
            LEFT + plot_w,
            LEFT - 8.0,
            ty + 4.0
        );
    }
    let step = ((summary.rounds as f64 / 8.0).ceil() as u32).max(1);
    for round in (0..summary.rounds).step_by(step as usize) {
        let tx = x(f64::from(round));
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{:.1}" x2="{tx:.1}" y2="{:.1}" stroke="#495057"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle">{round}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 5.0,
            TOP + plot_h + 18.0
        );
    }
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#495057"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">round</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 12.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">reward</text>"#,
        TOP + plot_h / 2.0
    );
    for (index, tenant) in summary.tenants.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let points: Vec<String> = tenant
            .rounds
            .iter()
            .filter_map(|r| {
                r.mean
                    .map(|m| format!("{:.1},{:.1}", x(f64::from(r.round)), y(m)))
            })
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            points.join(" ")
        );
        for (value, from, to) in [
            (tenant.baseline, 0.0, f64::from(summary.window - 1)),
            (tenant.last, rounds - f64::from(summary.window - 1), rounds),
        ] {
            if let Some(v) = value {
                let _ = writeln!(
                    svg,
                    r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{colour}" stroke-width="3" stroke-dasharray="6,3" opacity="0.7"/>"#,
                    x(from),
                    y(v),
                    x(to),
                    y(v)
                );
            }
        }
        let ly = TOP + 14.0 + 40.0 * index as f64;
        let lx = LEFT + plot_w + 14.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{} (prefers {})</text><text x="{:.1}" y="{:.1}" fill="#495057">{} → {}</text>"##,
            lx + 22.0,
            lx + 28.0,
            ly + 4.0,
            escape(&tenant.name),
            tenant.prefers,
            lx + 28.0,
            ly + 20.0,
            tenant.baseline.map_or("n/a".into(), |v| format!("{v:+.2}")),
            tenant.last.map_or("n/a".into(), |v| format!("{v:+.2}")),
        );
    }
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" fill="#495057">{} swaps, {} failed requests</text>"##,
        LEFT + plot_w + 14.0,
        TOP + 14.0 + 40.0 * summary.tenants.len() as f64 + 10.0,
        summary.swaps,
        summary.requests.failed
    );
    svg.push_str("</svg>\n");
    svg
}
