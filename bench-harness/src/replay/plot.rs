//! The plot printer: one SVG with the TTFT CDF (left) and the token cache hit rate over time
//! (right), one line per report, so `compare` shows policies on the same axes.

use std::path::Path;

use plotters::prelude::*;

use super::report::ReplayReport;

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Writes the plot of `reports` to `path` (SVG).
pub fn write_plot(path: &Path, reports: &[ReplayReport]) -> Result<(), String> {
    let root = SVGBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(600);
    draw_ttft_cdf(&left, reports)?;
    draw_hit_rate(&right, reports)?;
    root.present().map_err(plot_error)
}

fn plot_error(e: impl std::fmt::Display) -> String {
    format!("plot: {e}")
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_ttft_cdf(area: &Area, reports: &[ReplayReport]) -> Result<(), String> {
    let x_max = reports
        .iter()
        .flat_map(|r| r.ttft_cdf.iter().map(|p| p.ms))
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("TTFT CDF", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0..x_max * 1.05, 0.0..1.0)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("time to first token (ms)")
        .y_desc("fraction of requests")
        .draw()
        .map_err(plot_error)?;
    for (i, report) in reports.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let points = report.ttft_cdf.iter().map(|p| (p.ms, p.fraction));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(plot_error)?
            .label(report.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_error)
}

fn draw_hit_rate(area: &Area, reports: &[ReplayReport]) -> Result<(), String> {
    let t_max = reports
        .iter()
        .flat_map(|r| r.hit_rate_over_time.iter().map(|p| p.t_s))
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("token cache hit rate over time", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(44)
        .build_cartesian_2d(0.0..t_max * 1.05, 0.0..100.0)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .y_desc("cached / prompt tokens (%)")
        .draw()
        .map_err(plot_error)?;
    for (i, report) in reports.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let points = report
            .hit_rate_over_time
            .iter()
            .map(|p| (p.t_s, p.hit_rate * 100.0));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(plot_error)?
            .label(format!(
                "{} ({:.1}% overall)",
                report.label,
                report.cache_hit_rate * 100.0
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_error)
}
