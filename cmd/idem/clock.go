package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/idemkv/idem/pebblestore"
)

func runClock(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("clock", flag.ContinueOnError)
	flags.SetOutput(stderr)
	dir := flags.String("data", defaultDataDir, "directory of the idempotency store")
	reset := flags.Bool("reset", false, "move the clock mark back to this machine's clock")
	flags.Usage = func() {
		fmt.Fprint(flags.Output(), `usage: idem clock [--data DIR] [--reset]

Prints the store's clock mark, the newest time it has written under, beside
this machine's clock. While the clock is behind the mark by more than the
tolerance (5s by default), the store refuses claims (503 clock_behind).
Put the clock right and claims resume by themselves.

If instead the mark is wrong, left by a clock that ran ahead, --reset moves
it back to the clock. Records written under that clock keep its times:
they expire that much later, and a claim still in progress from then keeps
its lease until then. Only the embedded store has a mark.

The tool needs the directory to itself: a running proxy holds it
and must be stopped first (SIGTERM lets its requests finish).

Reference: `+docsURL("docs/devices.md#wrong-clocks")+`

`)
		flags.PrintDefaults()
	}
	if code, done := parseTool(flags, args, stderr); done {
		return code
	}
	op, code := openExisting("clock", *dir, false, stderr)
	if op == nil {
		return code
	}
	db := op.(*pebblestore.Store)
	mark, ok := db.ClockMark()
	now := time.Now()
	switch {
	case !ok:
		fmt.Fprintf(stdout, "no clock mark yet; clock %s\n", stamp(now))
	case *reset:
		was := mark
		mark, err := db.ResetClockMark(context.Background())
		if err != nil {
			fmt.Fprintf(stderr, "idem clock: %v\n", err)
			return closeStore("clock", db, 1, stderr)
		}
		fmt.Fprintf(stdout, "clock mark reset from %s to %s\n", stamp(was), stamp(mark))
	case now.Before(mark):
		fmt.Fprintf(stdout, "clock mark %s; clock %s, %s behind it\n", stamp(mark), stamp(now), mark.Sub(now).Round(time.Millisecond))
	default:
		fmt.Fprintf(stdout, "clock mark %s; clock %s, %s past it\n", stamp(mark), stamp(now), now.Sub(mark).Round(time.Millisecond))
	}
	return closeStore("clock", db, 0, stderr)
}

// stamp formats t for people, in UTC to the millisecond.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
