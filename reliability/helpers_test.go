package reliability_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/internal/idemtest"
	"github.com/idemkv/idem/internal/pgtest"
	"github.com/idemkv/idem/pebblestore"
	"github.com/idemkv/idem/pgstore"
)

// guard bounds every wait for a process or a condition. It only turns a
// hang into a failure; nothing waits for it to pass.
const guard = 30 * time.Second

// upstreamProc is the recording upstream, running as its own process.
type upstreamProc struct {
	*crashtest.Process
	url     string
	journal string
}

func startUpstream(t *testing.T, maxDelay time.Duration) *upstreamProc {
	t.Helper()
	journal := filepath.Join(t.TempDir(), "journal")
	p, err := crashtest.Start(upstreamBin, nil, "--journal", journal, "--max-delay", maxDelay.String())
	require.NoError(t, err)
	t.Cleanup(func() {
		if !p.Exited() {
			p.Kill()
		}
	})
	url, err := p.WaitListening(guard)
	require.NoError(t, err)
	return &upstreamProc{Process: p, url: url, journal: journal}
}

// executions returns how many executions the journal holds.
func (u *upstreamProc) executions(t *testing.T) int {
	t.Helper()
	execs, err := crashtest.ReadJournal(u.journal)
	require.NoError(t, err)
	return len(execs)
}

// proxyArgs are the flags every campaign proxy gets: keys scoped by the
// X-Tenant header, no admin listener unless asked, no event lines.
func proxyArgs(data, listen, upstream string, extra ...string) []string {
	return storeProxyArgs([]string{"--data", data}, listen, upstream, extra...)
}

// pgProxyArgs are proxyArgs for a replica that keeps its records in the
// PostgreSQL database dsn.
func pgProxyArgs(dsn, listen, upstream string, extra ...string) []string {
	return storeProxyArgs([]string{"--store", dsn}, listen, upstream, extra...)
}

// proxyStore is a new, empty store for campaign proxies.
type proxyStore struct {
	// args returns the proxy's arguments, as proxyArgs does.
	args func(listen, upstream string, extra ...string) []string
	// records returns every record in the store, read with the library
	// once the proxies have stopped.
	records func(t *testing.T) []*idem.Record
}

// proxyStores are the stores a campaign runs its proxies on, by name:
// the embedded store in a directory, and PostgreSQL, where any number of
// replicas share one database.
var proxyStores = []struct {
	name     string
	replicas int // how many proxies a test may run on one store at once
	new      func(t *testing.T) proxyStore
}{
	{"pebble", 1, func(t *testing.T) proxyStore {
		data := t.TempDir()
		return proxyStore{
			args: func(listen, upstream string, extra ...string) []string {
				return proxyArgs(data, listen, upstream, extra...)
			},
			records: func(t *testing.T) []*idem.Record {
				db, err := pebblestore.Open(data, &pebblestore.Options{SweepInterval: -1, MustExist: true, Logger: quietLogger()})
				require.NoError(t, err)
				defer db.Close()
				return allRecords(t, db)
			},
		}
	}},
	{"postgres", replicaCount, func(t *testing.T) proxyStore {
		dsn := pgtest.DSN(t)
		return proxyStore{
			args: func(listen, upstream string, extra ...string) []string {
				return pgProxyArgs(dsn, listen, upstream, extra...)
			},
			records: func(t *testing.T) []*idem.Record {
				db, err := pgstore.Open(context.Background(), dsn, &pgstore.Options{Migrate: pgstore.MigrateRefuse, Logger: quietLogger()})
				require.NoError(t, err)
				defer db.Close()
				return allRecords(t, db)
			},
		}
	}},
}

// allRecords returns every record in db, expired or not.
func allRecords(t *testing.T, db idem.Operator) []*idem.Record {
	t.Helper()
	var out []*idem.Record
	for rec, err := range db.Records(context.Background(), idem.Filter{Expired: true}) {
		require.NoError(t, err)
		out = append(out, rec)
	}
	return out
}

// storeProxyArgs are proxyArgs with the flags that name the store.
func storeProxyArgs(store []string, listen, upstream string, extra ...string) []string {
	args := append([]string{"proxy"}, store...)
	args = append(args, "--listen", listen, "--admin", "", "--upstream", upstream,
		"--tenant-from", "header:"+crashtest.TenantHeader, "--events=false")
	return append(args, extra...)
}

// startProxy starts an idem proxy and waits for its listening line. The
// test's end stops it with SIGTERM if it still runs.
func startProxy(t *testing.T, args []string) (*crashtest.Process, string) {
	t.Helper()
	p, err := crashtest.Start(idemBin, nil, args...)
	require.NoError(t, err)
	t.Cleanup(func() {
		if !p.Exited() {
			p.Signal(syscall.SIGTERM)
			p.Wait(guard)
		}
	})
	url, err := p.WaitListening(guard)
	require.NoError(t, err)
	return p, url
}

// quietLogger drops idem's warnings: the campaigns provoke them on purpose.
func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// reply is a response read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// code returns the problem document's code, or "" if the body is not one.
func (r reply) code() string {
	if r.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct{ Code string }
	if json.Unmarshal(r.body, &p) != nil {
		return ""
	}
	return p.Code
}

func (r reply) replayed() bool { return r.header.Get("Idempotent-Replayed") == "true" }

// comparable is what must be identical between a response and its replay:
// status, body, and the header without the date, the replay mark and the
// framing. A first answer streamed in chunks has no Content-Length, and
// net/http gives its replay, written at once, one.
func (r reply) comparable() reply {
	h := r.header.Clone()
	h.Del("Date")
	h.Del("Content-Length")
	h.Del("Idempotent-Replayed")
	return reply{status: r.status, header: h, body: r.body}
}

// do sends one request; header holds name, value pairs, each added.
func do(ctx context.Context, c *http.Client, method, url, body string, header ...string) (reply, error) {
	status, h, b, err := idemtest.Send(ctx, c, method, url, body, header...)
	return reply{status, h, b}, err
}

// newClient returns a client with its own connection pool, so that
// connections to a killed proxy are not shared with anything else.
func newClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.MaxIdleConnsPerHost = 64
	return &http.Client{Transport: tr, Timeout: guard}
}

func syscallTERM() os.Signal { return syscall.SIGTERM }
