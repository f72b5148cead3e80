//go:build !linux

package main

import "os"

// fdatasync falls back to a full fsync where the system has no fdatasync.
func fdatasync(f *os.File) error { return f.Sync() }
