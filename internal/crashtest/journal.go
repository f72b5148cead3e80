// Package crashtest holds what the reliability campaign needs outside the
// process under test: a recording upstream whose journal of executions
// survives any crash of the proxy in front of it, and a handle on a
// command run as a real process, to be killed with SIGKILL and restarted.
//
// The journal is the campaign's ground truth. An execution is appended and
// synced before the upstream answers, so whatever the proxy did or forgot,
// the journal says how often each key really ran.
package crashtest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Execution is one run of the upstream's operation, as the journal keeps it.
type Execution struct {
	Serial uint64 // unique per upstream process and journal
	Tenant string // the X-Tenant header the upstream was sent
	Key    string // the idempotency key the upstream was sent
	Path   string
	Body   string // hex SHA-256 of the request body
}

// Journal appends executions to a file, each synced before Append returns.
// It is safe for concurrent use.
type Journal struct {
	mu sync.Mutex
	f  *os.File // guarded by mu
}

// OpenJournal opens the journal at path for appending, creating it if
// needed.
func OpenJournal(path string) (*Journal, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Journal{f: f}, nil
}

// Append writes e as one line and syncs the file: once it returns, the
// execution is on disk whatever happens to any process.
func (j *Journal) Append(e Execution) error {
	line := fmt.Sprintf("%d\t%q\t%q\t%q\t%s\n", e.Serial, e.Tenant, e.Key, e.Path, e.Body)
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.WriteString(line); err != nil {
		return err
	}
	return j.f.Sync()
}

// Close closes the file.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.f.Close()
}

// ReadJournal returns every complete execution in the journal at path, in
// the order they were appended. A last line without its newline was torn by
// a crash of the upstream itself and was never answered, so it is left out.
func ReadJournal(path string) ([]Execution, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[:i+1]
	} else {
		data = nil
	}
	var out []Execution
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 5 {
			return nil, fmt.Errorf("journal line %d: %d fields", n, len(f))
		}
		var e Execution
		if e.Serial, err = strconv.ParseUint(f[0], 10, 64); err != nil {
			return nil, fmt.Errorf("journal line %d: %v", n, err)
		}
		for i, p := range []*string{&e.Tenant, &e.Key, &e.Path} {
			if *p, err = strconv.Unquote(f[i+1]); err != nil {
				return nil, fmt.Errorf("journal line %d: %v", n, err)
			}
		}
		e.Body = f[4]
		out = append(out, e)
	}
	return out, sc.Err()
}

// TenantKey joins a tenant and a key into one map key; NUL appears in
// neither, since both travel in header values.
func TenantKey(tenant, key string) string { return tenant + "\x00" + key }
