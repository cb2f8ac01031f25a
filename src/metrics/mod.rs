//! Per-core counters and histograms, merged on scrape into the Prometheus text exposition.
