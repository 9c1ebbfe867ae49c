//! A self-contained HTML report: the scenario matrix and latency charts
//! (inline SVG, no scripts, no external files).

use std::fmt::Write;

use conformance::scenarios::{SCENARIOS, Verdict};

use crate::compare::BackendResult;

fn esc(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Horizontal bars, one group per backend, for the given (label, value)
/// series; a log scale when values span more than two decades.
fn bar_chart(title: &str, unit: &str, rows: &[(String, Vec<(&str, f64)>)]) -> String {
    let max = rows
        .iter()
        .flat_map(|(_, s)| s.iter().map(|(_, v)| *v))
        .fold(0.0_f64, f64::max);
    let min = rows
        .iter()
        .flat_map(|(_, s)| s.iter().map(|(_, v)| *v))
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let log = max > 0.0 && min.is_finite() && max / min > 100.0;
    let scale = |v: f64| -> f64 {
        if max <= 0.0 {
            0.0
        } else if log {
            let lo = (min / 2.0).log10();
            ((v.max(min / 2.0)).log10() - lo) / (max.log10() - lo)
        } else {
            v / max
        }
    };
    let colors = ["#4477aa", "#ee6677", "#228833", "#ccbb44"];
    let bar_h = 14.0;
    let group_h: f64 =
        rows.iter().map(|(_, s)| s.len()).max().unwrap_or(1) as f64 * (bar_h + 2.0) + 10.0;
    let height = 40.0 + group_h * rows.len() as f64;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<h3>{}</h3><svg xmlns="http://www.w3.org/2000/svg" width="760" height="{height}" font-family="sans-serif" font-size="12">"#,
        esc(title)
    );
    for (g, (name, series)) in rows.iter().enumerate() {
        let y0 = 20.0 + g as f64 * group_h;
        let _ = write!(
            svg,
            r#"<text x="0" y="{}" font-weight="bold">{}</text>"#,
            y0 + bar_h,
            esc(name)
        );
        for (i, (label, value)) in series.iter().enumerate() {
            let y = y0 + i as f64 * (bar_h + 2.0);
            let w = 480.0 * scale(*value);
            let _ = write!(
                svg,
                r#"<rect x="110" y="{y}" width="{w:.1}" height="{bar_h}" fill="{}"/><text x="{:.1}" y="{:.1}">{} {value:.1} {}</text>"#,
                colors[i % colors.len()],
                115.0 + w,
                y + bar_h - 3.0,
                esc(label),
                esc(unit)
            );
        }
    }
    if log {
        let _ = write!(
            svg,
            r##"<text x="110" y="{}" fill="#666">log scale</text>"##,
            height - 4.0
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One histogram per backend on a shared log2 axis (1 µs .. 16 s).
fn histograms(results: &[BackendResult]) -> String {
    let rows: Vec<(&str, &[u32])> = results
        .iter()
        .filter_map(|r| {
            r.bench
                .cycle_histogram
                .as_ref()
                .map(|h| (r.name.as_str(), &h[..]))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    // Show the bucket range that has samples anywhere.
    let used = |i: usize| rows.iter().any(|(_, h)| h.get(i).copied().unwrap_or(0) > 0);
    let first = (0..conformance::bench::HISTOGRAM_BUCKETS)
        .find(|i| used(*i))
        .unwrap_or(0);
    let last = (0..conformance::bench::HISTOGRAM_BUCKETS)
        .rev()
        .find(|i| used(*i))
        .unwrap_or(0);
    let buckets = last - first + 1;
    let col = (600.0 / buckets as f64).min(40.0);
    let row_h = 60.0;
    let height = 30.0 + row_h * rows.len() as f64 + 20.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<h3>Acquire + release latency distribution</h3><svg xmlns="http://www.w3.org/2000/svg" width="760" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    for (r, (name, hist)) in rows.iter().enumerate() {
        let base = 20.0 + row_h * (r as f64 + 1.0);
        let max = hist.iter().copied().max().unwrap_or(1).max(1);
        let _ = write!(
            svg,
            r#"<text x="0" y="{:.1}" font-weight="bold">{}</text>"#,
            base - row_h / 2.0,
            esc(name)
        );
        for i in first..=last {
            let count = hist.get(i).copied().unwrap_or(0);
            let h = (row_h - 12.0) * f64::from(count) / f64::from(max);
            let x = 110.0 + col * (i - first) as f64;
            let _ = write!(
                svg,
                r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="#4477aa"><title>{count} cycles</title></rect>"##,
                base - h,
                col - 2.0
            );
        }
    }
    let axis_y = 20.0 + row_h * rows.len() as f64 + 14.0;
    for i in first..=last {
        let x = 110.0 + col * (i - first) as f64;
        let micros = 1u64 << i;
        let label = if micros >= 1_000_000 {
            format!("{}s", micros / 1_000_000)
        } else if micros >= 1000 {
            format!("{}ms", micros / 1000)
        } else {
            format!("{micros}µs")
        };
        if (i - first) % 2 == 0 {
            let _ = write!(svg, r#"<text x="{x:.1}" y="{axis_y:.1}">{label}</text>"#);
        }
    }
    svg.push_str("</svg>");
    svg
}

/// What the summary's throughput columns measure, and the settings the
/// benchmarked servers ran with.
fn summary_notes(results: &[BackendResult]) -> String {
    let mut html = String::from(
        "<p><small><b>8 clients</b>: 8 clients in one process, each from \
         <code>distlock::connect(url)</code>, one task each; <b>1 client / 8 tasks</b>: one client \
         shared by 8 tasks; both on 8 keys, <code>lock(key).ttl(30s).wait(60s)</code> then release, \
         in rounds interleaved with 8 hand-written floor connections in the same process; each \
         figure is the median round, x floor the median of the rounds' ratios.</small></p>",
    );
    let with: Vec<&BackendResult> = results
        .iter()
        .filter(|r| r.bench.servers.is_some())
        .collect();
    if !with.is_empty() {
        html.push_str("<p>The timed benchmarks ran on servers started again with their durable defaults:</p><ul>");
        for r in with {
            let _ = write!(
                html,
                "<li><b>{}</b>: {}</li>",
                esc(&r.name),
                esc(r.bench.servers.as_deref().unwrap_or(""))
            );
        }
        html.push_str("</ul>");
    }
    html
}

/// The client shapes against the raw server lock (SQL session mode) and
/// the client library alone (ZooKeeper, etcd, Redis), for the backends
/// that have either.
fn baselines_table(results: &[BackendResult]) -> String {
    let rows: Vec<&BackendResult> = results
        .iter()
        .filter(|r| {
            r.bench.raw_throughput_8x8.is_some() || r.bench.crate_alone_throughput_8x8.is_some()
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut html = String::from(
        "<h3>Client shapes against the raw server lock and the client library alone</h3>\
         <table><tr><th>backend</th><th>8 raw ops/s</th><th>8 clients / raw</th>\
         <th>1 client / raw</th><th>floor / raw (token's cost)</th><th>library</th>\
         <th>8 library alone ops/s</th><th>alone / floor</th><th>8 clients / alone</th>\
         <th>1 library client (8 tasks) / floor</th><th>1 client / 1 library client</th></tr>",
    );
    let f = |v: Option<f64>, d: usize| v.map_or("-".to_owned(), |v| format!("{v:.d$}"));
    for r in rows {
        let b = &r.bench;
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.name),
            f(b.raw_throughput_8x8, 0),
            f(b.throughput_raw_ratio, 2),
            f(b.throughput_shared_client_raw_ratio, 2),
            f(b.token_cost_ratio, 2),
            esc(b.crate_alone_library.as_deref().unwrap_or("-")),
            f(b.crate_alone_throughput_8x8, 0),
            f(b.crate_alone_floor_ratio, 2),
            f(b.throughput_crate_alone_ratio, 2),
            f(b.crate_alone_shared_client_floor_ratio, 2),
            f(b.throughput_shared_client_crate_alone_ratio, 2),
        );
    }
    html.push_str(
        "</table><p><small>The same interleaved rounds as the client shapes. <b>raw</b>: the \
         server's own lock taken by hand with no fencing token (SQL session mode: \
         <code>pg_try_advisory_lock</code> / <code>GET_LOCK</code>, then unlock), one bare \
         connection each; floor / raw is what the driver's grant adds to it (the fencing token and \
         the holder it publishes). <b>library alone</b>: the \
         driver's requests of a cycle through its required client library and nothing else; \
         alone / floor is the library's share of a gap to the floor, 8 clients / alone the \
         driver's own; one library client shared by 8 tasks is the shared shape's baseline the \
         same way. Medians of the rounds' ratios.</small></p>",
    );
    html
}

/// Renders the report.
pub(crate) fn render(results: &[BackendResult]) -> String {
    let mut html = String::from(
        r#"<!doctype html><html><head><meta charset="utf-8"><title>distlock compare</title>
<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.safe{background:#d8f0d8}.violation{background:#f8c8c8;font-weight:bold}.flagged{background:#fde8b0}.skipped{color:#999}
small{color:#555}</style></head><body><h1>distlock: backends compared</h1>
<p>Measured on this machine in one run. <b>safe</b>: nothing unsafe happened; <b>flagged</b>: a negative control, the unsafe outcome this backend cannot prevent was observed and reported; <b>VIOLATION</b>: unsafe where safety is promised, or a negative control that showed nothing.</p>"#,
    );
    // Summary table.
    html.push_str("<h2>Summary</h2><table><tr><th>backend</th><th>url</th><th>conformance</th><th>cycle p50 µs</th><th>cycle p99 µs</th><th>x floor</th><th>8 clients ops/s</th><th>x floor</th><th>1 client / 8 tasks ops/s</th><th>x floor</th><th>handoffs/s</th><th>x floor</th><th>round trips/cycle (floor)</th><th>bytes/lock</th></tr>");
    for r in results {
        let b = &r.bench;
        let f = |v: Option<f64>, d: usize| v.map_or("-".to_owned(), |v| format!("{v:.d$}"));
        let _ = write!(
            html,
            "<tr><td>{}</td><td><small>{}</small></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{}</td></tr>",
            esc(&r.name),
            esc(&r.url),
            esc(&r.error.clone().unwrap_or_else(|| r.verdict())),
            f(b.cycle_p50_us, 1),
            f(b.cycle_p99_us, 1),
            f(b.cycle_ratio, 2),
            f(b.throughput_8x8, 0),
            f(b.throughput_ratio, 2),
            f(b.throughput_shared_client, 0),
            f(b.throughput_shared_client_ratio, 2),
            f(b.handoffs_per_s, 0),
            f(b.handoff_ratio, 2),
            f(b.round_trips_per_cycle, 1),
            f(b.floor_round_trips_per_cycle, 1),
            f(b.bytes_per_held_lock, 0),
        );
    }
    html.push_str("</table>");
    html.push_str(&summary_notes(results));
    html.push_str(&baselines_table(results));
    // Scenario matrix.
    let with: Vec<&BackendResult> = results.iter().filter(|r| !r.scenarios.is_empty()).collect();
    if !with.is_empty() {
        html.push_str("<h2>Safety under faults</h2><table><tr><th>scenario</th>");
        for r in &with {
            let _ = write!(html, "<th>{}</th>", esc(&r.name));
        }
        html.push_str("</tr>");
        for name in SCENARIOS {
            let _ = write!(html, "<tr><td>{name}</td>");
            for r in &with {
                match r.scenarios.get(*name) {
                    Some(s) => {
                        let (class, word) = match s.verdict {
                            Verdict::Safe => ("safe", "safe"),
                            Verdict::Violation => ("violation", "VIOLATION"),
                            Verdict::Flagged => ("flagged", "flagged"),
                            Verdict::Skipped => ("skipped", "skipped"),
                        };
                        let _ = write!(
                            html,
                            r#"<td class="{class}" title="{}">{word}</td>"#,
                            esc(&s.detail)
                        );
                    }
                    None => html.push_str("<td>-</td>"),
                }
            }
            html.push_str("</tr>");
        }
        html.push_str("</table><p><small>Hover a cell for what happened.</small></p>");
    }
    // Latency charts.
    let latency: Vec<(String, Vec<(&str, f64)>)> = results
        .iter()
        .filter_map(|r| {
            let b = &r.bench;
            let mut s = Vec::new();
            if let Some(v) = b.cycle_p50_us {
                s.push(("p50", v));
            }
            if let Some(v) = b.cycle_p99_us {
                s.push(("p99", v));
            }
            if let Some(v) = b.floor_cycle_p50_us {
                s.push(("floor p50", v));
            }
            (!s.is_empty()).then(|| (r.name.clone(), s))
        })
        .collect();
    if !latency.is_empty() {
        html.push_str("<h2>Latency</h2>");
        html.push_str(&bar_chart("Uncontended acquire + release", "µs", &latency));
        html.push_str(&histograms(results));
    }
    let throughput: Vec<(String, Vec<(&str, f64)>)> = results
        .iter()
        .filter_map(|r| {
            let b = &r.bench;
            let mut s = Vec::new();
            if let Some(v) = b.throughput_8x8 {
                s.push(("8 clients x 8 keys", v));
            }
            if let Some(v) = b.throughput_shared_client {
                s.push(("1 client, 8 tasks x 8 keys", v));
            }
            if let Some(v) = b.floor_throughput_8x8 {
                s.push(("8 floor connections", v));
            }
            if let Some(v) = b.handoffs_per_s {
                s.push(("handoffs, 4 clients on 1 key", v));
            }
            (!s.is_empty()).then(|| (r.name.clone(), s))
        })
        .collect();
    if !throughput.is_empty() {
        html.push_str(&bar_chart("Throughput", "/s", &throughput));
    }
    // Details.
    html.push_str("<h2>Details</h2>");
    for r in results {
        let _ = write!(html, "<h3>{}</h3>", esc(&r.name));
        if let Some(e) = &r.error {
            let _ = write!(html, "<p>{}</p>", esc(e));
            continue;
        }
        let _ = write!(
            html,
            "<p><small>capabilities: {}</small></p>",
            esc(&r.capabilities.to_string())
        );
        if let Some(servers) = &r.bench.servers {
            let _ = write!(
                html,
                "<p>Benchmarks on servers started again with: {}</p>",
                esc(servers)
            );
        }
        if !r.left_to_full_run.is_empty() {
            let _ = write!(
                html,
                "<p><b>Not checked by this quick run</b> (left to the full run): {}</p>",
                esc(&r.left_to_full_run.join(", "))
            );
        }
        if let Some(s) = &r.conformance {
            html.push_str(
                "<table><tr><th>case</th><th>verdict</th><th>ms</th><th>detail</th></tr>",
            );
            for c in &s.cases {
                let class = match c.verdict {
                    "passed" => "safe",
                    "failed" => "violation",
                    _ => "skipped",
                };
                let _ = write!(
                    html,
                    r#"<tr><td>{}</td><td class="{class}">{}</td><td>{}</td><td style="text-align:left"><small>{}</small></td></tr>"#,
                    c.name,
                    c.verdict,
                    c.elapsed_ms,
                    esc(&c.detail)
                );
            }
            html.push_str("</table>");
        }
        if !r.scenarios.is_empty() {
            html.push_str(
                "<table><tr><th>scenario</th><th>verdict</th><th>detail and figures</th></tr>",
            );
            for (name, s) in &r.scenarios {
                let figures = serde_json::to_string(&s.figures).unwrap_or_default();
                let _ = write!(
                    html,
                    r#"<tr><td>{name}</td><td>{:?}</td><td style="text-align:left"><small>{}<br>{}</small></td></tr>"#,
                    s.verdict,
                    esc(&s.detail),
                    esc(&figures)
                );
            }
            html.push_str("</table>");
        }
    }
    html.push_str("</body></html>\n");
    html
}
