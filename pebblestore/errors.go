package pebblestore

import (
	"errors"

	"github.com/idemkv/idem"
)

// Errors of the embedded store alone; the contract's errors are package
// idem's.
var (
	// ErrLocked: another Store handle, in this process or another, holds
	// the directory.
	ErrLocked = errors.New("idem: data directory is in use")
	// ErrNoStore: Open with Options.MustExist found no store in the
	// directory.
	ErrNoStore = errors.New("idem: no store in directory")
)

// The embedded store is a full backend of the contract.
var (
	_ idem.Operator = (*Store)(nil)
	_ idem.Sizer    = (*Store)(nil)
)
