package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemprom"
)

// healthTimeout bounds a health check's read of the store: a disk that
// hangs must turn into 503, not into a probe that never answers.
const healthTimeout = 2 * time.Second

// admin is what the proxy shows operators: Prometheus metrics and a
// health check, over a registry of their own so that nothing else in the
// process can add to or collide with it.
type admin struct {
	db       idem.Operator
	log      *slog.Logger
	reg      *prometheus.Registry
	observer *idemprom.Observer // for idemhttp.Options.Observe
}

func newAdmin(db idem.Operator, log *slog.Logger) (*admin, error) {
	col, err := idemprom.NewCollector(db, nil)
	if err != nil {
		return nil, err
	}
	obs, err := idemprom.NewObserver(nil)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{
		col, obs,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return &admin{db: db, log: log, reg: reg, observer: obs}, nil
}

// register adds GET /metrics and GET /healthz to mux. /metrics needs a
// token when g has a metrics token; a health probe never does.
func (a *admin) register(mux *http.ServeMux, g *adminGuard) {
	var metrics http.Handler = promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{
		// When the store cannot be read, the rest still matters most:
		// the 503 store_unavailable answers counted by the observer.
		// The failure is logged, counted in
		// promhttp_metric_handler_errors_total and seen by /healthz.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
		Registry:      a.reg,
	})
	if g.metrics != nil {
		metrics = behind(metrics, "/metrics", g.metrics, g.read, g.write)
	}
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", a.healthz)
}

// healthz answers 200 ok when the store can be read, 503 otherwise. The
// reason given is short and fixed; the error itself, which may name files,
// goes to the log.
func (a *admin) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	err := a.db.Ping(ctx)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err == nil {
		io.WriteString(w, "ok\n")
		return
	}
	reason := "store unreadable"
	switch {
	case errors.Is(err, idem.ErrClosed):
		reason = "store closed"
	case errors.Is(err, context.DeadlineExceeded):
		reason = "store did not answer in time"
	}
	a.log.Warn("idem: health check failed", "err", err)
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, reason+"\n")
}
