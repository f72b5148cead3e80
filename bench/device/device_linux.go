package device

import "syscall"

// Local returns this machine's view: its own /proc and /sys, and st_dev
// from stat(2).
func Local() Host { return Host{Root: "/", DevOf: statDev} }

// statDev returns the major and minor numbers of the device of the
// filesystem holding path, as Linux encodes them in st_dev.
func statDev(path string) (major, minor uint32, err error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, 0, err
	}
	dev := uint64(st.Dev)
	major = uint32((dev>>8)&0xfff) | uint32((dev>>32)&^0xfff)
	minor = uint32(dev&0xff) | uint32((dev>>12)&^0xff)
	return major, minor, nil
}

// SyncAll writes every filesystem's dirty pages to its device, so that
// the page cache's deferred writeback lands before a counter is read.
func SyncAll() { syscall.Sync() }
