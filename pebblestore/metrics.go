package pebblestore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/internal/keys"
	"github.com/idemkv/idem/internal/rows"
)

// Size returns the room the store's files take and the room left on their
// disk, for idem.Limits' guard: cheap enough to read every second.
func (db *Store) Size(ctx context.Context) (idem.StoreSize, error) {
	if err := ctx.Err(); err != nil {
		return idem.StoreSize{}, err
	}
	if err := db.enter(); err != nil {
		return idem.StoreSize{}, err
	}
	defer db.exit()
	sz := idem.StoreSize{Bytes: int64(db.pdb.Metrics().DiskSpaceUsage()), FreeBytes: -1}
	if du, err := db.opts.fs.GetDiskUsage(db.dir); err == nil {
		sz.FreeBytes = int64(du.AvailBytes)
	}
	return sz, nil
}

// Metrics returns a snapshot of the contract's counters and Pebble's own
// figures. Its cost grows with the number of records that are not
// completed or have expired unswept (it reads the pending index and the
// due part of the expiry index), not with the size of the store.
func (db *Store) Metrics(ctx context.Context) (idem.Metrics, error) {
	if err := ctx.Err(); err != nil {
		return idem.Metrics{}, err
	}
	if err := db.enter(); err != nil {
		return idem.Metrics{}, err
	}
	defer db.exit()
	sw := db.sweeper.Totals()
	m := idem.Metrics{Events: db.tally.Counts(), BytesReclaimed: sw.Bytes}

	now := db.now()
	err := db.rows.ScanPending(time.Unix(0, 1<<63-1), func(e rows.Pending) bool {
		switch e.State {
		case idem.StateInProgress:
			m.InProgress++
			if !now.Before(e.Due) {
				m.Overdue++
			}
			m.OldestInProgress = max(m.OldestInProgress, now.Sub(e.Created))
		case idem.StateUnknown:
			m.UnknownRecords++
		case idem.StateFailed:
			m.FailedRecords++
		}
		return true
	})
	if err != nil {
		return m, err
	}
	if m.Expired, err = db.rows.CountExpired(now); err != nil {
		return m, err
	}
	pm := db.pdb.Metrics()
	commits, syncs := db.commits.Counts()
	written := db.wal.Written()
	m.Engine = []idem.Figure{
		{Name: FigureCommits, Help: "Writes committed through group commit.", Counter: true,
			Value: float64(commits)},
		{Name: FigureSyncs, Help: "WAL syncs behind those writes; commits divided by syncs is the batching factor.", Counter: true,
			Value: float64(syncs)},
		{Name: FigureSweepCompactions, Help: "Compactions the sweeper asked for over swept key spans.", Counter: true,
			Value: float64(sw.Compactions)},
		{Name: FigurePebbleCompactions, Help: "Compactions Pebble ran, automatic ones included.", Counter: true,
			Value: float64(pm.Compact.Count)},
		{Name: FigurePebbleFlushes, Help: "Memtable flushes Pebble ran.", Counter: true,
			Value: float64(pm.Flush.Count)},
		{Name: FigureBytesWritten, Help: "Bytes written to the store's files: logs and the zeros kept ahead of them, tables, blob files, manifests.", Counter: true,
			Value: float64(written.Total())},
		{Name: FigureLogBytesWritten, Help: "Bytes of records written to the write-ahead logs.", Counter: true,
			Value: float64(written.Log)},
		{Name: FigureZeroBytesWritten, Help: "Bytes of zeros written ahead of the logs' ends, so that their syncs change no file size.", Counter: true,
			Value: float64(written.Zeros)},
		{Name: FigureTableBytesWritten, Help: "Bytes of sstables written by flushes and compactions.", Counter: true,
			Value: float64(written.Tables)},
		{Name: FigureBlobBytesWritten, Help: "Bytes of blob files written by flushes and their rewrites.", Counter: true,
			Value: float64(written.Blobs)},
		{Name: FigureDiskBytes, Help: "Space the store occupies on disk.",
			Value: float64(pm.DiskSpaceUsage())},
		{Name: FigureReadAmp, Help: "Sstables a read may have to visit.",
			Value: float64(pm.ReadAmp())},
	}
	return m, nil
}

// The names of the embedded store's figures in Metrics.Engine.
const (
	FigureCommits           = "idem_commits_total"
	FigureSyncs             = "idem_wal_syncs_total"
	FigureSweepCompactions  = "idem_sweeper_compactions_total"
	FigurePebbleCompactions = "idem_pebble_compactions_total"
	FigurePebbleFlushes     = "idem_pebble_flushes_total"
	FigureBytesWritten      = "idem_written_bytes_total"
	FigureLogBytesWritten   = "idem_written_log_bytes_total"
	FigureZeroBytesWritten  = "idem_written_zero_bytes_total"
	FigureTableBytesWritten = "idem_written_table_bytes_total"
	FigureBlobBytesWritten  = "idem_written_blob_bytes_total"
	FigureDiskBytes         = "idem_disk_usage_bytes"
	FigureReadAmp           = "idem_read_amplification"
)

// Ping reports whether the store can serve reads: it reads one small key,
// so it fails once the store is closed or Pebble can no longer read, but it
// writes nothing (a write failure ends the process anyway). Health checks
// call it.
func (db *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := db.enter(); err != nil {
		return err
	}
	defer db.exit()
	_, closer, err := db.pdb.Get(keys.Schema)
	if err != nil {
		return fmt.Errorf("idem: read schema version: %w", err)
	}
	return closer.Close()
}
