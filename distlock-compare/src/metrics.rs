//! The library's metrics recorded while a backend's suite and scenarios
//! run: a Prometheus recorder in this process, read before and after, the
//! difference reported per backend in `compare --json`.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process's Prometheus recorder on first use (a no-op when
/// another recorder was installed first: the reports then carry no
/// metrics).
pub(crate) fn install_once() {
    HANDLE.get_or_init(|| PrometheusBuilder::new().install_recorder().ok());
}

/// The counters and the histograms' counts and sums now (empty without
/// the recorder).
pub(crate) fn snapshot() -> BTreeMap<String, f64> {
    let Some(handle) = HANDLE.get().and_then(Option::as_ref) else {
        return BTreeMap::new();
    };
    samples(&handle.render())
        .into_iter()
        .filter(|(series, _)| {
            let name = series.split('{').next().unwrap_or_default();
            name.ends_with("_total") || name.ends_with("_count") || name.ends_with("_sum")
        })
        .collect()
}

/// What grew from `before` to `after` (series that did not move are left
/// out).
pub(crate) fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(series, value)| {
            let grown = value - before.get(series).copied().unwrap_or(0.0);
            (grown > 0.0).then(|| (series.clone(), grown))
        })
        .collect()
}

/// The samples of a Prometheus text page as `(series, value)` pairs, in
/// page order (comment lines skipped).
fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_read_series_and_values() {
        let text = "# TYPE x counter\nx{backend=\"sqlite\"} 3\ny 0.5\n\nbad line\n";
        assert_eq!(
            samples(text),
            vec![
                ("x{backend=\"sqlite\"}".to_owned(), 3.0),
                ("y".to_owned(), 0.5)
            ]
        );
    }

    #[test]
    fn delta_keeps_what_grew() {
        let before = BTreeMap::from([("a_total".to_owned(), 2.0), ("b_total".to_owned(), 1.0)]);
        let after = BTreeMap::from([
            ("a_total".to_owned(), 5.0),
            ("b_total".to_owned(), 1.0),
            ("c_count".to_owned(), 1.0),
        ]);
        assert_eq!(
            delta(&before, &after),
            BTreeMap::from([("a_total".to_owned(), 3.0), ("c_count".to_owned(), 1.0)])
        );
    }
}
