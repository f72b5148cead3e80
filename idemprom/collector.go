package idemprom

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkv/idem"
)

// storeMetric is one series a Collector derives from idem.Metrics.
type storeMetric struct {
	name, help string
	kind       prometheus.ValueType
	value      func(*idem.Metrics) float64
}

// storeMetrics lists every series of a Collector: a counter per
// idem.Event, then the figures every backend reports. It is read only.
var storeMetrics = append(eventMetrics(), []storeMetric{
	{"idem_reclaimed_bytes_total", "Size of the expired records the sweeper deleted, body chunks included.", prometheus.CounterValue,
		func(m *idem.Metrics) float64 { return float64(m.BytesReclaimed) }},

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
	{"idem_replay_ratio", "Share of successful claims answered from the store: replays over claims plus replays, 0 before the first.", prometheus.GaugeValue,
		func(m *idem.Metrics) float64 {
			claims, replays := m.Events[idem.EventClaimed], m.Events[idem.EventReplayed]
			if n := claims + replays; n > 0 {
				return float64(replays) / float64(n)
			}
			return 0
		}},
}...)

// eventMetrics returns a counter series for each idem.Event.
func eventMetrics() []storeMetric {
	out := make([]storeMetric, idem.NumEvents)
	for e := range idem.Event(idem.NumEvents) {
		out[e] = storeMetric{e.Series(), e.Help(), prometheus.CounterValue,
			func(m *idem.Metrics) float64 { return float64(m.Events[e]) }}
	}
	return out
}

// Collector is a prometheus.Collector over one store of the contract.
// Each scrape calls the store's Metrics once, so its cost is that call's
// (for the embedded store it grows with the records not completed, not
// with the size of the store). Besides the contract's series it exports
// the backend's own figures (Metrics.Engine) under their own names. It is
// safe for concurrent use. Create one with NewCollector.
type Collector struct {
	store   idem.Operator
	timeout time.Duration
	descs   []*prometheus.Desc // parallel to storeMetrics
	// engine holds a descriptor for each engine figure the store reported
	// when the Collector was made, in that order.
	engine      map[string]*prometheus.Desc
	engineOrder []*prometheus.Desc
	// failed is the descriptor of the error a scrape reports when the
	// store cannot be read.
	failed *prometheus.Desc
}

// CollectorOptions configure a Collector. The zero value selects the
// defaults given in each field's comment.
type CollectorOptions struct {
	// Timeout bounds each read of the store's metrics. A scrape that
	// reaches it reports a scrape error rather than holding the scraper
	// (and a connection of the store's) until its own timeout. Default:
	// 5 seconds, below Prometheus's default scrape timeout.
	Timeout time.Duration
}

// NewCollector returns a Collector over store, to be registered on a
// registry; opts may be nil for the defaults. It reads the store's
// metrics once, to learn the names of its engine figures, and fails when
// that read does. An error in opts matches idem.ErrInvalidOptions.
func NewCollector(store idem.Operator, opts *CollectorOptions) (*Collector, error) {
	var o CollectorOptions
	if opts != nil {
		o = *opts
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	switch {
	case store == nil:
		return nil, fmt.Errorf("%w: idemprom: NewCollector needs a store", idem.ErrInvalidOptions)
	case o.Timeout < 0:
		return nil, fmt.Errorf("%w: idemprom: CollectorOptions.Timeout %s must not be negative", idem.ErrInvalidOptions, o.Timeout)
	}
	c := &Collector{
		store:   store,
		timeout: o.Timeout,
		descs:   make([]*prometheus.Desc, len(storeMetrics)),
		engine:  map[string]*prometheus.Desc{},
		failed:  prometheus.NewDesc("idem_store_metrics", "Reading the store's metrics.", nil, nil),
	}
	m, err := c.read()
	if err != nil {
		return nil, err
	}
	for i, sm := range storeMetrics {
		c.descs[i] = prometheus.NewDesc(sm.name, sm.help, nil, nil)
	}
	for _, f := range m.Engine {
		d := prometheus.NewDesc(f.Name, f.Help, nil, nil)
		c.engine[f.Name] = d
		c.engineOrder = append(c.engineOrder, d)
	}
	return c, nil
}

// Describe sends the descriptors of every series Collect may send.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	for _, d := range c.engineOrder {
		ch <- d
	}
	ch <- c.failed
}

// Collect reads the store's metrics and sends them. When the store cannot
// be read (it is closed, or the disk fails) it sends a single invalid
// metric carrying the error, which the registry reports as a scrape
// error; a partial snapshot would show counts that are not true.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	m, err := c.read()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.failed, err)
		return
	}
	for i, sm := range storeMetrics {
		ch <- prometheus.MustNewConstMetric(c.descs[i], sm.kind, sm.value(&m))
	}
	for _, f := range m.Engine {
		d, ok := c.engine[f.Name]
		if !ok {
			continue
		}
		kind := prometheus.GaugeValue
		if f.Counter {
			kind = prometheus.CounterValue
		}
		ch <- prometheus.MustNewConstMetric(d, kind, f.Value)
	}
}

// read reads the store's metrics within the collector's timeout.
func (c *Collector) read() (idem.Metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	m, err := c.store.Metrics(ctx)
	if err != nil {
		return idem.Metrics{}, fmt.Errorf("idemprom: reading the store's metrics: %w", err)
	}
	return m, nil
}
