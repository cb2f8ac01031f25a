//! The gateway's `/metrics` as the chaos checks read it: [`Scrape`] (Prometheus text, one value
//! per series) and the invariants that compare it with the admin API's worker list.

use std::collections::BTreeSet;

/// One scrape: `(name, labels, value)` per sample line, labels as written (`a="x",b="y"`).
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    pub samples: Vec<(String, String, f64)>,
}

impl Scrape {
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let value: f64 = value.parse().ok()?;
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, rest.strip_suffix('}')?),
                    None => (series, ""),
                };
                Some((name.to_string(), labels.to_string(), value))
            })
            .collect();
        Scrape { samples }
    }

    /// The samples of `name`: `(labels, value)`.
    pub fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
        self.samples
            .iter()
            .filter(move |(n, _, _)| n == name)
            .map(|(_, labels, value)| (labels.as_str(), *value))
    }

    /// Sum over every series of `name` (0 when absent).
    pub fn sum(&self, name: &str) -> f64 {
        self.series(name).map(|(_, v)| v).sum()
    }

    /// The values of label `label` across the series of `name`.
    pub fn label_values(&self, name: &str, label: &str) -> BTreeSet<String> {
        self.series(name)
            .filter_map(|(labels, _)| label_value(labels, label))
            .collect()
    }
}

/// The value of `label` in `a="x",b="y"` (no escapes in the values the checks read).
pub fn label_value(labels: &str, label: &str) -> Option<String> {
    let prefix = format!("{label}=\"");
    let start = labels.find(&prefix)? + prefix.len();
    let end = labels[start..].find('"')? + start;
    Some(labels[start..end].to_string())
}

/// The gauges that must agree with the registered workers: every per-worker series names a
/// registered worker and every registered worker has one; no tree counts more tenants than
/// there are workers. Returns one message per disagreement.
pub fn tree_and_worker_gauges_agree(scrape: &Scrape, workers: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for family in ["smg_worker_requests_active", "smg_worker_health"] {
        let seen = scrape.label_values(family, "worker");
        if &seen != workers {
            problems.push(format!(
                "{family} has series for {seen:?}, the admin API lists {workers:?}"
            ));
        }
    }
    for (labels, tenants) in scrape.series("smg_cache_tree_tenants") {
        if tenants > workers.len() as f64 {
            problems.push(format!(
                "smg_cache_tree_tenants{{{labels}}} = {tenants} with {} workers registered",
                workers.len()
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP smg_worker_requests_active x\n\
        smg_worker_requests_active{worker=\"http://a:1\"} 2\n\
        smg_worker_requests_active{worker=\"http://b:2\"} 0\n\
        smg_worker_health{worker=\"http://a:1\"} 1\n\
        smg_worker_health{worker=\"http://b:2\"} 1\n\
        smg_cache_tree_tenants{model=\"m\",tree=\"string\"} 2\n\
        kvgate_upstream_responses_cut_total 3\n";

    #[test]
    fn parses_series_and_sums() {
        let scrape = Scrape::parse(TEXT);
        assert_eq!(scrape.sum("smg_worker_requests_active"), 2.0);
        assert_eq!(scrape.sum("kvgate_upstream_responses_cut_total"), 3.0);
        assert_eq!(scrape.sum("absent"), 0.0);
        assert_eq!(
            label_value("model=\"m\",tree=\"string\"", "tree").as_deref(),
            Some("string")
        );
    }

    #[test]
    fn gauges_must_match_the_worker_list() {
        let scrape = Scrape::parse(TEXT);
        let both: BTreeSet<String> = ["http://a:1", "http://b:2"].map(String::from).into();
        assert!(tree_and_worker_gauges_agree(&scrape, &both).is_empty());
        let one: BTreeSet<String> = ["http://a:1"].map(String::from).into();
        let problems = tree_and_worker_gauges_agree(&scrape, &one);
        // Both worker families disagree, and 2 tenants exceed 1 worker.
        assert_eq!(problems.len(), 3, "{problems:?}");
    }
}
