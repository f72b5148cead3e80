// Package idemprom exports idem's metrics to Prometheus. It lives apart
// from the core package so that programs which do not use Prometheus never
// link its client.
//
// # What it exports
//
// A Collector reads a store's Metrics (idem.Operator) at scrape time
// and reports the contract's view, the same for every backend: a counter
// for each idem.Event (idem_claims_total, idem_replays_total,
// idem_conflicts_total for a key in progress, idem_mismatches_total for a
// key reused with another request, idem_outcome_pending_total,
// idem_completions_total, idem_releases_total, idem_unknowns_total,
// idem_failures_total, idem_takeovers_total, idem_reconciled_total,
// idem_swept_records_total, idem_clock_behind_total for claims refused
// while the clock was behind), idem_reclaimed_bytes_total, gauges of the
// records that need attention (idem_in_progress_records,
// idem_overdue_records, idem_oldest_in_progress_age_seconds,
// idem_unknown_records, idem_failed_records, idem_expired_records), and
// idem_replay_ratio, the share of claims answered from the store. Beside
// them it reports the backend's own figures under their own names: for the
// embedded store, group commit (idem_commits_total, idem_wal_syncs_total),
// the sweeper's and Pebble's compactions, flushes, bytes written to the
// store's files (idem_written_bytes_total), disk use
// (idem_disk_usage_bytes) and read amplification. The counters start from
// zero when the store is opened. When the store cannot be read the scrape
// reports an error for these metrics instead of stale values.
//
// An Observer plugs into idemhttp.Options.Observe and counts what the
// middleware answered: idem_http_requests_total{endpoint,outcome,code}
// and idem_http_request_duration_seconds{endpoint,outcome}. The outcome is
// "executed", "replayed" or the problem code a request was refused with
// ("request_in_progress", "idempotency_key_reuse", "outcome_pending",
// "idempotency_key_missing", ...); code is the HTTP status. No label ever
// carries a tenant or a key: both are unbounded, and a key must not leak
// into a monitoring system.
//
// # Use
//
// Register both on a registry of your own and hand the observer to the
// middleware:
//
//	reg := prometheus.NewRegistry()
//	col, err := idemprom.NewCollector(db, nil)
//	...
//	obs, err := idemprom.NewObserver(nil)
//	...
//	reg.MustRegister(col, obs)
//	mw, err := idemhttp.New(idemhttp.Options{Store: db, Tenant: tenant, Observe: obs.Observe})
//	http.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// To export several DBs from one process, register each collector through
// prometheus.WrapRegistererWith with a label that tells them apart.
//
// # Queries
//
// The rates the idempotency contract is judged by, per endpoint:
//
//	# share of keyed requests answered 409 because the first is still running
//	sum by (endpoint) (rate(idem_http_requests_total{outcome="request_in_progress"}[5m]))
//	  / sum by (endpoint) (rate(idem_http_requests_total[5m]))
//
//	# keys reused with a different request (422): a client bug
//	sum by (endpoint) (rate(idem_http_requests_total{outcome="idempotency_key_reuse"}[5m]))
//
//	# share of requests answered from the store
//	sum(rate(idem_http_requests_total{outcome="replayed"}[5m]))
//	  / sum(rate(idem_http_requests_total{outcome=~"executed|replayed"}[5m]))
//
//	# time to answer a replay, 99th percentile
//	histogram_quantile(0.99, sum by (le) (rate(idem_http_request_duration_seconds_bucket{outcome="replayed"}[5m])))
//
// and from the store: idem_overdue_records > 0 or idem_unknown_records > 0
// means outcomes wait for reconciliation or an operator, and
// rate(idem_commits_total[5m]) / rate(idem_wal_syncs_total[5m]) is how many
// writes share one sync.
package idemprom
