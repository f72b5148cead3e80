package idemprom

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkv/idem"
)

// storeMetric is one series a Collector derives from idem.Metrics.
type storeMetric struct {
	name, help string
	kind       prometheus.ValueType
	value      func(*idem.Metrics) float64
}

// storeMetrics lists every series of a Collector. It is read only.
var storeMetrics = []storeMetric{
	{"idem_claims_total", "Claims that won their key, so the operation ran.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Claims) }},
	{"idem_replays_total", "Claims answered with the response stored by an earlier attempt.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Replays) }},
	{"idem_conflicts_total", "Claims refused because the key was in progress (HTTP 409 request_in_progress).", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Conflicts) }},
	{"idem_mismatches_total", "Claims refused because the key was used for a different request (HTTP 422).", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Mismatches) }},
	{"idem_outcome_pending_total", "Claims refused because an earlier attempt's outcome is unknown or failed (HTTP 409 outcome_pending).", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Pending) }},
	{"idem_completions_total", "Leases that stored their response.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Completions) }},
	{"idem_releases_total", "Leases that freed their key because nothing was committed.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Releases) }},
	{"idem_unknowns_total", "Leases that ended with an unknown outcome.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Unknowns) }},
	{"idem_failures_total", "Leases that ended marked failed.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Failures) }},
	{"idem_reconciled_total", "Overdue records the reconciler resolved.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Reconciled) }},
	{"idem_swept_records_total", "Expired records the sweeper deleted.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Swept) }},
	{"idem_reclaimed_bytes_total", "Size of the expired records the sweeper deleted, body chunks included.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.BytesReclaimed) }},
	{"idem_sweeper_compactions_total", "Compactions the sweeper asked for over swept key spans.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Compactions) }},
	{"idem_commits_total", "Writes committed through group commit.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Commits) }},
	{"idem_wal_syncs_total", "WAL syncs behind those writes; commits divided by syncs is the batching factor.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.Syncs) }},
	{"idem_pebble_compactions_total", "Compactions Pebble ran, automatic ones included.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.PebbleCompactions) }},
	{"idem_pebble_flushes_total", "Memtable flushes Pebble ran.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.PebbleFlushes) }},

	{"idem_in_progress_records", "Records in progress now, with a live lease or not.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 { return float64(m.InProgress) }},
	{"idem_overdue_records", "Records still in progress past their lease: their outcome waits for reconciliation.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 { return float64(m.Overdue) }},
	{"idem_oldest_in_progress_age_seconds", "Age of the oldest record in progress, 0 when there is none.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 { return m.OldestInProgress.Seconds() }},
	{"idem_unknown_records", "Records whose outcome is unknown; retries get outcome_pending until they are resolved.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 { return float64(m.UnknownRecords) }},
	{"idem_failed_records", "Records marked failed; retries get outcome_pending until they are resolved.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 { return float64(m.FailedRecords) }},
	{"idem_expired_records", "Records past their TTL that the sweeper has not deleted yet; reads already ignore them.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 { return float64(m.Expired) }},
	{"idem_disk_usage_bytes", "Space the store occupies on disk.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 { return float64(m.DiskBytes) }},
	{"idem_read_amplification", "Sstables a read may have to visit.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 { return float64(m.ReadAmp) }},
	{"idem_replay_ratio", "Share of successful claims answered from the store: replays over claims plus replays, 0 before the first.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 {
			if n := m.Claims + m.Replays; n > 0 {
				return float64(m.Replays) / float64(n)
			}
			return 0
		}},
}

// Collector is a prometheus.Collector over one idem.DB. Each scrape calls
// DB.Metrics once, so its cost is that call's: it grows with the records
// not completed, not with the size of the store. It is safe for concurrent
// use. Create one with NewCollector.
type Collector struct {
	db    *idem.DB
	descs []*prometheus.Desc // parallel to storeMetrics
	// failed is the descriptor of the error a scrape reports when the
	// store cannot be read.
	failed *prometheus.Desc
}

// NewCollector returns a Collector over db, to be registered on a
// registry. It fails only when db is nil.
func NewCollector(db *idem.DB) (*Collector, error) {
	if db == nil {
		return nil, errors.New("idemprom: NewCollector needs a DB")
	}
	c := &Collector{
		db:     db,
		descs:  make([]*prometheus.Desc, len(storeMetrics)),
		failed: prometheus.NewDesc("idem_store_metrics", "Reading the store's metrics.", nil, nil),
	}
	for i, sm := range storeMetrics {
		c.descs[i] = prometheus.NewDesc(sm.name, sm.help, nil, nil)
	}
	return c, nil
}

// Describe sends the descriptors of every series Collect may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	ch <- c.failed
}

// Collect reads the store's metrics and sends them. When the store cannot
// be read (it is closed, or the disk fails) it sends a single invalid
// metric carrying the error, which the registry reports as a scrape
// error; a partial snapshot would show counts that are not true.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	m, err := c.db.Metrics()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.failed, fmt.Errorf("idemprom: reading the store's metrics: %w", err))
		return
	}
	for i, sm := range storeMetrics {
		ch <- prometheus.MustNewConstMetric(c.descs[i], sm.kind, sm.value(&m))
	}
}
