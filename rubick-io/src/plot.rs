//! Figures as PNG or SVG (by the file's extension), written atomically, with a
//! bundled font so that plots need no system fonts.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

/// DejaVu Sans (licence beside it in `assets/`).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

fn register_font() {
    REGISTER.call_once(|| {
        if plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            tracing::warn!("the bundled font could not be loaded; plot text may be missing");
        }
    });
}

/// Distinct colours for series (matplotlib's tab10).
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Ticks of a logarithmic axis over `lo..hi`: 1, 2 and 5 times each power of ten in the
/// range (1 and 3 over more than 3 decades, the powers alone over more than 6), so that
/// an axis short of a decade, or between two powers (300 to 900 s), still has labels.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && hi > lo) {
        return Vec::new();
    }
    let (first, last) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    let mantissas: &[f64] = match last - first {
        ..=3 => &[1.0, 2.0, 5.0],
        4..=6 => &[1.0, 3.0],
        _ => &[1.0],
    };
    (first..=last)
        .flat_map(|e| mantissas.iter().map(move |m| m * 10f64.powi(e)))
        .filter(|t| (lo..=hi).contains(t))
        .collect()
}

/// A tick's label: whole numbers with thousands separators (`500`, `2,000`, `20,000`),
/// smaller ones with the decimals they need (`0.5`, `0.02`).
pub fn tick_label(x: f64) -> String {
    if x.abs() >= 1.0 && (x - x.round()).abs() < 1e-9 {
        let digits = format!("{:.0}", x.abs());
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        if x < 0.0 { format!("-{out}") } else { out }
    } else {
        let text = format!("{x:.6}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// Whole numbers on an axis of indices (`50`, never `50.0`); ticks between them unlabelled.
pub fn index_label(y: f64) -> String {
    if (y - y.round()).abs() < 1e-9 { format!("{:.0}", y) } else { String::new() }
}

/// Something that draws itself on any plotters backend.
pub trait Figure {
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static;
}

/// Turns a plotters drawing error into an `anyhow` error.
pub fn drawing_error<E: std::error::Error + Send + Sync + 'static>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing the plot: {e}")
}

/// Writes `figure` as SVG or PNG (by extension), atomically.
pub fn write_figure(path: &Path, size: (u32, u32), figure: &impl Figure) -> anyhow::Result<()> {
    register_font();
    match path.extension().and_then(|e| e.to_str()) {
        Some("svg") => {
            let mut svg = String::new();
            figure.draw(SVGBackend::with_string(&mut svg, size).into_drawing_area())?;
            crate::write_atomic(path, svg.as_bytes())?;
        }
        Some("png") if crate::files::is_special(path) => {
            // A device or FIFO: draw in a private directory, then write in place.
            let dir = tempfile::tempdir()?;
            let tmp = dir.path().join("plot.png");
            figure.draw(BitMapBackend::new(&tmp, size).into_drawing_area())?;
            crate::write_atomic(path, &std::fs::read(&tmp)?)?;
        }
        Some("png") => {
            let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let tmp = crate::files::temp_file_in(dir, ".plot.", ".png")?;
            figure.draw(BitMapBackend::new(tmp.path(), size).into_drawing_area())?;
            tmp.persist(path).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.error))?;
        }
        _ => anyhow::bail!("{}: expected a .png or .svg plot file", path.display()),
    }
    Ok(())
}

/// Draws the series legend the same way in every figure: white box, black border.
pub fn legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>, position: SeriesLabelPosition) -> anyhow::Result<()>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: plotters::coord::CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(position)
        .draw()
        .map_err(drawing_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_axis_has_ticks_below_a_thousand_and_labels_read_as_numbers() {
        assert_eq!(log_ticks(300.0, 7200.0), [500.0, 1000.0, 2000.0, 5000.0]);
        assert_eq!(log_ticks(1.0, 1e9).len(), 10);
        assert!(log_ticks(0.0, 10.0).is_empty());
        assert_eq!(
            [500.0, 2000.0, 20000.0, 1_234_567.0, 0.5, 0.02].map(tick_label),
            ["500", "2,000", "20,000", "1,234,567", "0.5", "0.02"]
        );
        assert_eq!([50.0, 100.0, 12.5].map(index_label), ["50", "100", ""]);
    }
}
