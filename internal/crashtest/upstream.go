package crashtest

import (
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"hash/fnv"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// TenantHeader is the header the campaign's clients name their tenant in,
// and the proxy scopes keys by (--tenant-from header:X-Tenant).
const TenantHeader = "X-Tenant"

// Upstream is the service behind the proxy: every request it reads in full
// is one execution, journalled durably before it answers 201 with a body
// that names the execution. A second execution of a key would therefore
// answer different bytes, and show twice in the journal.
type Upstream struct {
	Journal *Journal
	// MaxDelay bounds a random pause between journalling and answering,
	// which widens the window in which a kill lands inside the upstream
	// call. Zero answers at once.
	MaxDelay time.Duration

	nonce  string // tells this process's executions from another's
	serial atomic.Uint64
}

// NewUpstream returns an upstream that journals to j.
func NewUpstream(j *Journal, maxDelay time.Duration) *Upstream {
	return &Upstream{Journal: j, MaxDelay: maxDelay, nonce: crand.Text()[:8]}
}

// Answer is the body of the upstream's response.
type Answer struct {
	Serial uint64 `json:"serial"`
	Nonce  string `json:"nonce"`
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
	Body   string `json:"body_sha256"`
}

// Chunked reports whether the upstream answers key without a
// Content-Length, streaming its body in two parts. A client of the proxy
// then sees the end of the body only when the proxy's handler returns, which
// is after the outcome is stored; with a Content-Length it has every byte as
// soon as the proxy passed them on. The campaign wants both.
func Chunked(key string) bool {
	h := fnv.New32a()
	io.WriteString(h, key)
	return h.Sum32()%2 == 0
}

func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// The proxy went away before the request was whole: nothing ran.
		return
	}
	sum := sha256.Sum256(body)
	a := Answer{
		Serial: u.serial.Add(1),
		Nonce:  u.nonce,
		Tenant: r.Header.Get(TenantHeader),
		Key:    r.Header.Get("Idempotency-Key"),
		Body:   hex.EncodeToString(sum[:]),
	}
	if err := u.Journal.Append(Execution{Serial: a.Serial, Tenant: a.Tenant, Key: a.Key, Path: r.URL.Path, Body: a.Body}); err != nil {
		// Without its journal line an execution would go uncounted; the
		// campaign cannot trust anything after that.
		log.Fatalf("upstream: journal: %v", err)
	}
	if u.MaxDelay > 0 {
		time.Sleep(rand.N(u.MaxDelay))
	}
	out, _ := json.Marshal(a)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/charges/"+strconv.FormatUint(a.Serial, 10))
	if !Chunked(a.Key) {
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.WriteHeader(http.StatusCreated)
		w.Write(out)
		return
	}
	w.WriteHeader(http.StatusCreated)
	half := len(out) / 2
	w.Write(out[:half])
	http.NewResponseController(w).Flush()
	w.Write(out[half:])
}
