// Package reliability_test is idem's reliability campaign: the promise that
// a retry never executes twice and an acknowledged result is never lost,
// checked against real failures. It kills a real `idem proxy` with SIGKILL
// in front of an upstream that journals every execution durably, injects
// read, write, sync and disk-full faults under the store, sends hostile
// input through the middleware and the proxy, soaks the proxy with
// concurrent clients, and checks tenant isolation as a property. On
// PostgreSQL it kills replicas that share one database and restarts the
// server under load, and sends hostile input and several tenants' keys
// through replicas.
//
// `go test ./...` runs a CI-sized campaign. The flags make it longer:
//
//	go test ./reliability -run TestKillCampaign -kills 2000 -timeout 0 -v
//	go test ./reliability -run TestReplicaKillCampaign -pgkills 300 -timeout 0 -v
//	go test ./reliability -run TestSoak -soak 60s -v
//	go test ./reliability -run 'TestFault|TestWAL' -faults 2000 -timeout 0 -v
//
// -short runs each campaign for a few rounds only. -seed N replays a randomized test with the seed its failure
// printed.
//
// Each test logs its figures (kills survived, faults injected, inputs
// tried, duplicates, results lost, RSS and goroutines) with -v.
package reliability_test

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/idemkv/idem/internal/crashtest"
	"github.com/idemkv/idem/internal/pgtest"
)

var (
	kills   = flag.Int("kills", 20, "SIGKILLs of the proxy in the kill campaign")
	pgKills = flag.Int("pgkills", 10, "SIGKILLs of a replica in the PostgreSQL campaign; the server restarts once, and every 30 rounds")
	// CI soaks for 30 s: from a cold build cache the whole CI run takes
	// about 15 minutes, and the soak is the largest part of the tests.
	soakFor   = flag.Duration("soak", 30*time.Second, "how long the proxy soak runs; the in-process soak runs half as long")
	faultRuns = flag.Int("faults", 60, "rounds of the in-process fault campaign; the WAL campaign runs a tenth of them, at least 4")
	seedFlag  = flag.Uint64("seed", 0, "seed of every randomized test, to replay a failure; 0 takes one from the clock")
)

// seedFor returns the seed of t's randomness: -seed when it is given,
// else one from the clock. When t fails it says how to run it again with
// the same seed.
func seedFor(t *testing.T) uint64 {
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("to replay: go test ./reliability -run '^%s$' -seed %d", t.Name(), seed)
		}
	})
	return seed
}

// shortCampaigns makes the kill, fault and soak campaigns a few rounds
// each under -short, the quick run, unless their flags were given; CI
// runs them at the sizes above.
func shortCampaigns() {
	if !testing.Short() {
		return
	}
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, v := range map[string]string{"kills": "2", "pgkills": "1", "soak": "10s", "faults": "8"} {
		if !set[name] {
			_ = flag.Set(name, v)
		}
	}
}

// Binaries built once for the whole package.
var idemBin, upstreamBin string

func TestMain(m *testing.M) {
	flag.Parse()
	shortCampaigns()
	dir, err := os.MkdirTemp("", "idem-reliability")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if os.Getenv(walChildEnv) != "" {
			return m.Run() // a child of the WAL campaign needs no binaries
		}
		if idemBin, err = crashtest.Build(dir, "github.com/idemkv/idem/cmd/idem"); err == nil {
			upstreamBin, err = crashtest.Build(dir, "github.com/idemkv/idem/internal/crashtest/cmd/upstream")
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return pgtest.Main(m)
	}()
	os.Exit(code)
}

func TestSeedFlag(t *testing.T) {
	defer func(s uint64) { *seedFlag = s }(*seedFlag)
	*seedFlag = 42
	if got := seedFor(t); got != 42 {
		t.Fatalf("seedFor = %d with -seed 42", got)
	}
	*seedFlag = 0
	if seedFor(t) == 0 {
		t.Fatal("seedFor = 0 without -seed")
	}
}
