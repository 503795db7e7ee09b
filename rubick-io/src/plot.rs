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
