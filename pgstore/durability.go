package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// ErrNotDurable: Options.RequireSynchronousStandby is set and the
// server's settings, as the store's connections see them, let a failover
// lose claims the store acknowledged. The error names the settings.
var ErrNotDurable = errors.New("pgstore: the server's settings can lose acknowledged claims in a failover")

// durability is what the server's settings make of a committed claim.
type durability struct {
	fsync, syncCommit, standbyNames string
	inRecovery                      bool
	syncStandbys                    int // synchronous standbys connected now, as far as the role may see
}

func readDurability(ctx context.Context, q querier) (durability, error) {
	var d durability
	err := q.QueryRow(ctx, `SELECT pg_catalog.current_setting('fsync'), pg_catalog.current_setting('synchronous_commit'),
	pg_catalog.current_setting('synchronous_standby_names'), pg_catalog.pg_is_in_recovery(),
	(SELECT count(*) FROM pg_catalog.pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))`).
		Scan(&d.fsync, &d.syncCommit, &d.standbyNames, &d.inRecovery, &d.syncStandbys)
	if err != nil {
		return d, fmt.Errorf("pgstore: read the server's durability settings: %w", err)
	}
	return d, nil
}

// failover reports whether a commit is acknowledged only once a
// synchronous standby has it, so that promoting that standby loses none.
func (d durability) failover() bool {
	if d.fsync != "on" || d.standbyNames == "" {
		return false
	}
	switch d.syncCommit {
	case "on", "remote_apply", "remote_write":
		return true
	}
	return false
}

// survives says in a sentence what an acknowledged claim survives, and
// whether that deserves a warning.
func (d durability) survives() (string, bool) {
	switch {
	case d.inRecovery:
		return "nothing yet: the server is a standby in recovery and refuses writes until it is promoted " +
			"(name the primary, or add target_session_attrs=read-write to a DSN with several hosts)", true
	case d.fsync != "on" || d.syncCommit == "off":
		return "not even a crash of this server: with fsync or synchronous_commit off, the last acknowledged claims " +
			"may be lost, and their retries run again", true
	case !d.failover():
		return "a crash of this server, not its loss: a failover to an asynchronous standby may lose the last " +
			"acknowledged claims, and their retries run again", false
	case d.syncStandbys == 0:
		return "the loss of the primary too, once a synchronous standby is connected: none is now, " +
			"so commits wait for one", true
	case d.syncCommit == "remote_write":
		return "the loss of the primary too, when a synchronous standby is promoted, unless that standby's " +
			"operating system fails at the same time (remote_write)", false
	}
	return "the loss of the primary too, when a synchronous standby is promoted", false
}

// checkDurability logs what an acknowledged claim survives on this
// server, and refuses with ErrNotDurable when require is set and that is
// not the loss of the primary.
func checkDurability(ctx context.Context, q querier, log *slog.Logger, require bool) error {
	d, err := readDurability(ctx, q)
	if err != nil {
		return err
	}
	what, warn := d.survives()
	level := slog.LevelInfo
	if warn {
		level = slog.LevelWarn
	}
	log.Log(ctx, level, "pgstore: an acknowledged claim survives "+what,
		"synchronous_commit", d.syncCommit, "synchronous_standby_names", d.standbyNames,
		"fsync", d.fsync, "in_recovery", d.inRecovery, "synchronous_standbys_connected", d.syncStandbys)
	if require && !d.failover() {
		return fmt.Errorf("%w: synchronous_commit=%s, synchronous_standby_names=%q, fsync=%s; "+
			"name a synchronous standby (synchronous_standby_names) with synchronous_commit on or remote_apply",
			ErrNotDurable, d.syncCommit, d.standbyNames, d.fsync)
	}
	return nil
}
