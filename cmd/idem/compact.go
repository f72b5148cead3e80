package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/idemkv/idem"
)

func runCompact(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("compact", flag.ContinueOnError)
	flags.SetOutput(stderr)
	store := addStoreFlags(flags, "directory of the idempotency store")
	store.addAdmin()
	flags.Usage = func() {
		fmt.Fprint(flags.Output(), `usage: idem compact [--data DIR | --store DSN | --admin URL]

Deletes every record past its TTL now, with its body chunks and index
entries, then compacts the whole store so that the space they held goes
back to the disk. A running service does the same a little at a time;
this is for reclaiming space at once, after a burst or before a backup.
In a store whose endpoints have different TTLs, part of the space of
responses over a few hundred bytes stays in blob files shared with live
records; a running service has Pebble rewrite those files once a fifth of
all blob bytes are garbage.

With --store, compact deletes the expired rows from PostgreSQL and
reports how many; autovacuum gives their space back to the table, so
there are no disk sizes to compare. Serve and proxy on PostgreSQL sweep
once a minute anyway.

With --admin, the running server compacts its own store, and its
progress comes back as it goes; interrupting the tool stops the
compaction there. The disk sizes are left out: the server deletes the
files a compaction made obsolete in its own time, so idem stats --admin
shows the space reclaimed a little later.

Progress goes to standard error: a bar on a terminal, plain lines
otherwise. Interrupting it is safe: what was swept stays swept.

Reference: `+docsURL("docs/operating.md#expiry-and-storage")+`

`+toolStoreRule+"\n"+adminToolRule+"\n")
		flags.PrintDefaults()
	}
	if code, done := store.parseTool(flags, args, stderr); done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if store.admin != "" {
		return compactThroughAdmin(ctx, store, stdout, stderr)
	}
	db, code := store.openTool("compact", false, stderr)
	if db == nil {
		return code
	}
	if store.postgres() {
		p := newProgress(stderr)
		res, err := db.Compact(ctx, p.update)
		p.finish()
		if err != nil {
			fmt.Fprintf(stderr, "idem compact: %v\n", err)
			return closeStore("compact", db, 1, stderr)
		}
		fmt.Fprintf(stdout, "swept %d expired records (%s) from %s\n", res.Records, bytesIEC(uint64(res.Bytes)), store.where())
		return closeStore("compact", db, 0, stderr)
	}
	before, err := dirBytes(store.dir)
	if err != nil {
		fmt.Fprintf(stderr, "idem compact: %v\n", err)
		return closeStore("compact", db, 1, stderr)
	}
	p := newProgress(stderr)
	res, err := db.Compact(ctx, p.update)
	p.finish()
	if err != nil {
		fmt.Fprintf(stderr, "idem compact: %v\n", err)
		return closeStore("compact", db, 1, stderr)
	}
	// Pebble removes the files a compaction made obsolete in the
	// background, and Close waits for it: only then does the directory
	// show what was reclaimed.
	if code := closeStore("compact", db, 0, stderr); code != 0 {
		return code
	}
	after, err := dirBytes(store.dir)
	if err != nil {
		fmt.Fprintf(stderr, "idem compact: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "swept %d expired records (%s); disk %s -> %s\n",
		res.Records, bytesIEC(uint64(res.Bytes)), bytesIEC(uint64(before)), bytesIEC(uint64(after)))
	return 0
}

// compactThroughAdmin has the server behind --admin compact its store.
func compactThroughAdmin(ctx context.Context, store *storeFlags, stdout, stderr io.Writer) int {
	c, code := store.openAdmin("compact", stderr)
	if c == nil {
		return code
	}
	defer c.Close()
	p := newProgress(stderr)
	res, err := c.Compact(ctx, p.update)
	p.finish()
	if err != nil {
		fmt.Fprintf(stderr, "idem compact: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "swept %d expired records (%s) through the admin listener at %s\n", res.Records, bytesIEC(uint64(res.Bytes)), c.base)
	return 0
}

// dirBytes adds up the sizes of the files in the store's directory.
func dirBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		size, err := entryBytes(d)
		n += size
		return err
	})
	return n, err
}

// entryBytes is the size of a listed file. Pebble deletes obsolete files
// in the background, an older OPTIONS file right after Open for one, so a
// file listed a moment ago may be gone: it takes no space.
func entryBytes(d fs.DirEntry) (int64, error) {
	info, err := d.Info()
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

// progress shows how far a compaction has come: a bar redrawn in place on
// a terminal, one line per phase and per tenth of the work elsewhere, so a
// log file stays short.
type progress struct {
	w        io.Writer
	terminal bool
	phase    string
	tenth    int64 // last tenth printed, in plain mode
	drawn    bool
}

func newProgress(w io.Writer) *progress {
	return &progress{w: w, terminal: isTerminal(w)}
}

// isTerminal reports whether w is a character device, which is how a
// terminal looks from here without a dependency.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (p *progress) update(c idem.CompactProgress) {
	if p.terminal {
		if c.Phase != p.phase && p.drawn {
			fmt.Fprintln(p.w)
		}
		p.phase, p.drawn = c.Phase, true
		fmt.Fprintf(p.w, "\r%s", bar(c, 30))
		return
	}
	tenth := int64(10)
	if c.Total > 0 {
		tenth = c.Done * 10 / c.Total
	}
	if c.Phase != p.phase || tenth > p.tenth {
		p.phase, p.tenth = c.Phase, tenth
		fmt.Fprintf(p.w, "%s: %d/%d\n", c.Phase, c.Done, c.Total)
	}
}

// finish ends the bar's line.
func (p *progress) finish() {
	if p.terminal && p.drawn {
		fmt.Fprintln(p.w)
	}
}

// bar draws "sweep   [=======>      ]  45%  450/1000" in width cells.
func bar(c idem.CompactProgress, width int) string {
	frac := 1.0
	if c.Total > 0 {
		frac = min(1, float64(c.Done)/float64(c.Total))
	}
	full := int(frac * float64(width))
	cells := strings.Repeat("=", full)
	if full < width {
		cells += ">" + strings.Repeat(" ", width-full-1)
	}
	return fmt.Sprintf("%-8s[%s] %3.0f%%  %d/%d", c.Phase, cells, frac*100, c.Done, c.Total)
}
