package idemprom

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkv/idem"
)

// OtherEndpoint is the endpoint label of the requests no route named
// (Observation.Unrouted), and of those whose endpoint came after
// ObserverOptions.MaxEndpoints others.
const OtherEndpoint = "other"

// ObserverOptions configure an Observer. The zero value selects the
// defaults given in each field's comment.
type ObserverOptions struct {
	// Buckets are the upper bounds, in seconds, of the request duration
	// histogram, strictly increasing. Default: 1ms, 2.5ms, 5ms, 10ms,
	// 25ms, 50ms, 100ms, 250ms, 500ms, 1s, 2.5s, 5s, 10s and 30s: from a
	// replay out of the store to an operation as long as a default lease.
	Buckets []float64

	// MaxEndpoints bounds the distinct values of the endpoint label. An
	// endpoint no route named is always OtherEndpoint, since its name is
	// a URL path that may carry IDs; this bounds the rest, endpoints an
	// Options.Endpoint function names, in case it is no better. Past the
	// bound, new endpoints are counted as OtherEndpoint. Default: 100.
	MaxEndpoints int
}

// defaultBuckets are ObserverOptions.Buckets by default. Read only.
var defaultBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// Observer counts the answers of idemhttp middleware: pass its Observe
// method as idemhttp.Options.Observe and register it on a registry. It
// is safe for concurrent use. Create one with NewObserver.
type Observer struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	max      int

	mu        sync.RWMutex
	endpoints map[string]bool // endpoints with a label of their own, guarded by mu
}

// NewObserver validates opts and returns an Observer. opts may be nil for
// the defaults.
func NewObserver(opts *ObserverOptions) (*Observer, error) {
	var o ObserverOptions
	if opts != nil {
		o = *opts
	}
	if o.Buckets == nil {
		o.Buckets = defaultBuckets
	}
	if o.MaxEndpoints == 0 {
		o.MaxEndpoints = 100
	}
	var errs []error
	if len(o.Buckets) == 0 {
		errs = append(errs, fmt.Errorf("%w: idemprom: ObserverOptions.Buckets is empty", idem.ErrInvalidOptions))
	}
	for i, b := range o.Buckets {
		switch {
		case math.IsNaN(b) || math.IsInf(b, 0) || b <= 0:
			errs = append(errs, fmt.Errorf("%w: idemprom: ObserverOptions.Buckets[%d] %v must be a positive number of seconds", idem.ErrInvalidOptions, i, b))
		case i > 0 && b <= o.Buckets[i-1]:
			errs = append(errs, fmt.Errorf("%w: idemprom: ObserverOptions.Buckets[%d] %v must be larger than the bucket before it", idem.ErrInvalidOptions, i, b))
		}
	}
	if o.MaxEndpoints < 0 {
		errs = append(errs, fmt.Errorf("%w: idemprom: ObserverOptions.MaxEndpoints %d must not be negative", idem.ErrInvalidOptions, o.MaxEndpoints))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Observer{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_http_requests_total",
			Help: "Requests that needed an idempotency key, by endpoint, by what the middleware did (executed, replayed, or the problem code of a refusal) and by status code.",
		}, []string{"endpoint", "outcome", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_http_request_duration_seconds",
			Help:    "Time the middleware took to answer a request that needed an idempotency key, the handler included.",
			Buckets: append([]float64(nil), o.Buckets...),
		}, []string{"endpoint", "outcome"}),
		max:       o.MaxEndpoints,
		endpoints: map[string]bool{},
	}, nil
}

// Observe counts one answer. Its signature is that of
// idemhttp.Options.Observe.
func (o *Observer) Observe(ob idem.Observation) {
	ep := OtherEndpoint
	if !ob.Unrouted {
		ep = o.endpointLabel(ob.Endpoint)
	}
	outcome := strings.ToValidUTF8(ob.Outcome, "\uFFFD")
	o.requests.WithLabelValues(ep, outcome, strconv.Itoa(ob.Status)).Inc()
	o.duration.WithLabelValues(ep, outcome).Observe(ob.Duration.Seconds())
}

// endpointLabel returns the label value for endpoint, admitting it to the
// set of labelled endpoints while there is room.
func (o *Observer) endpointLabel(endpoint string) string {
	// A label value must be valid UTF-8 or the vector panics, and a URL
	// path decoded from %-escapes need not be.
	endpoint = strings.ToValidUTF8(endpoint, "\uFFFD")
	o.mu.RLock()
	known, full := o.endpoints[endpoint], len(o.endpoints) >= o.max
	o.mu.RUnlock()
	switch {
	case known:
		return endpoint
	case full:
		return OtherEndpoint
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.endpoints[endpoint] && len(o.endpoints) >= o.max {
		return OtherEndpoint
	}
	o.endpoints[endpoint] = true
	return endpoint
}

// Describe sends the descriptors of the two metric families.
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	o.requests.Describe(ch)
	o.duration.Describe(ch)
}

// Collect sends the current counts.
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	o.requests.Collect(ch)
	o.duration.Collect(ch)
}
