// Package device finds the block device that holds a directory and reads
// how many sectors the kernel has written to it since boot, the count
// flash wears with. It reads Linux's /proc and /sys; elsewhere Local
// finds no device.
//
// Most callers want Local().Find, or Devices for a system that spreads
// its files over several directories, then SectorsWritten before and
// after the work, times SectorBytes. SyncAll first writes back what the
// page cache holds, so that a reading includes it.
package device

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// SectorBytes is the unit of /proc/diskstats and /sys/block/*/stat,
// whatever the device's own sector size.
const SectorBytes = 512

// Device is a block device by its numbers, with the kernel's name for it
// (vda1, dm-0, nvme0n1p2).
type Device struct {
	Major, Minor uint32
	Name         string
}

func (d Device) String() string { return fmt.Sprintf("%s (%d:%d)", d.Name, d.Major, d.Minor) }

// NoDeviceError says why a directory has no block device to count: it is
// in memory, on a network, or on a filesystem whose device is not visible
// here.
type NoDeviceError struct {
	Short string // for a table: "n/a (tmpfs)", "n/a (overlay)", "n/a (8:99)"
	Why   string // the sentence Error returns
}

func (e *NoDeviceError) Error() string { return e.Why }

// Host is where the lookup reads the system's tables: Local for this
// machine, a fake tree in tests. Its methods only read files, and are
// safe for concurrent use. The zero Host is not usable.
type Host struct {
	// Root is the directory that holds proc and sys: "/" on this machine.
	Root string
	// DevOf returns the device numbers of the filesystem holding path
	// (its st_dev).
	DevOf func(path string) (major, minor uint32, err error)
}

func (h Host) path(p string) string { return filepath.Join(h.Root, p) }

// Find returns the block device that holds path. A filesystem with a real
// device (ext4, xfs on a disk, a partition or device-mapper) names it in
// st_dev; one with an anonymous device (major 0: tmpfs, overlay, btrfs,
// NFS, FUSE) is looked up in the mount table: btrfs by its source device,
// overlay by its upper directory, where its writes go; the rest have no
// device to count, and Find returns a *NoDeviceError.
func (h Host) Find(path string) (Device, error) {
	return h.find(path, 0)
}

func (h Host) find(path string, depth int) (Device, error) {
	major, minor, err := h.DevOf(path)
	if err != nil {
		return Device{}, err
	}
	if major != 0 {
		return h.device(major, minor)
	}
	m, err := h.mountOf(major, minor, path)
	if err != nil {
		return Device{}, err
	}
	switch {
	case m.fstype == "overlay":
		upper := m.option("upperdir")
		if upper == "" || depth > 2 {
			return Device{}, &NoDeviceError{"n/a (overlay)", "an overlay filesystem without an upper directory"}
		}
		d, err := h.find(upper, depth+1)
		if err != nil {
			return Device{}, &NoDeviceError{"n/a (overlay)", fmt.Sprintf("an overlay filesystem whose upper directory %s has no device here: %v", upper, err)}
		}
		return d, nil
	case strings.HasPrefix(m.source, "/dev/"):
		return h.deviceNamed(m.source)
	default:
		what := m.fstype
		if what == "tmpfs" || what == "ramfs" {
			what += ", in memory"
		}
		return Device{}, &NoDeviceError{"n/a (" + m.fstype + ")", fmt.Sprintf("%s is on %s, which has no block device", path, what)}
	}
}

// device names the device major:minor from sysfs, or from
// /proc/diskstats where sysfs is not mounted.
func (h Host) device(major, minor uint32) (Device, error) {
	id := fmt.Sprintf("%d:%d", major, minor)
	if target, err := os.Readlink(h.path("sys/dev/block/" + id)); err == nil {
		return Device{Major: major, Minor: minor, Name: filepath.Base(target)}, nil
	}
	stats, err := os.ReadFile(h.path("proc/diskstats"))
	if err != nil {
		return Device{}, err
	}
	for _, line := range strings.Split(string(stats), "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && f[0] == strconv.Itoa(int(major)) && f[1] == strconv.Itoa(int(minor)) {
			return Device{Major: major, Minor: minor, Name: f[2]}, nil
		}
	}
	return Device{}, &NoDeviceError{"n/a (" + id + ")", "device " + id + " keeps no statistics"}
}

// deviceNamed finds the device of a mount source such as /dev/vdb2 or
// /dev/mapper/vg-data.
func (h Host) deviceNamed(source string) (Device, error) {
	name := filepath.Base(source)
	if strings.HasPrefix(source, "/dev/mapper/") {
		dms, _ := filepath.Glob(h.path("sys/block/dm-*/dm/name"))
		for _, f := range dms {
			if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == name {
				name = filepath.Base(filepath.Dir(filepath.Dir(f)))
				break
			}
		}
	}
	b, err := os.ReadFile(h.path("sys/class/block/" + name + "/dev"))
	if err != nil {
		return Device{}, &NoDeviceError{"n/a (" + name + ")", fmt.Sprintf("the mount source %s is not a block device known to sysfs", source)}
	}
	var major, minor uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err != nil {
		return Device{}, fmt.Errorf("device: unexpected device numbers %q for %s", b, name)
	}
	return Device{Major: major, Minor: minor, Name: name}, nil
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	dev       string // major:minor
	point     string
	fstype    string
	source    string
	superOpts string
}

func (m mount) option(name string) string {
	for _, o := range strings.Split(m.superOpts, ",") {
		if v, ok := strings.CutPrefix(o, name+"="); ok {
			return v
		}
	}
	return ""
}

// mountOf returns the mount of device major:minor that holds path: of
// several (bind mounts, btrfs subvolumes), the one with the longest mount
// point that is a prefix of path.
func (h Host) mountOf(major, minor uint32, path string) (mount, error) {
	b, err := os.ReadFile(h.path("proc/self/mountinfo"))
	if err != nil {
		return mount{}, err
	}
	abs, _ := filepath.Abs(path)
	id := fmt.Sprintf("%d:%d", major, minor)
	var best mount
	for _, line := range strings.Split(string(b), "\n") {
		m, ok := parseMountinfo(line)
		if !ok || m.dev != id {
			continue
		}
		if within(abs, m.point) && len(m.point) >= len(best.point) {
			best = m
		}
	}
	if best.dev == "" {
		return mount{}, &NoDeviceError{"n/a (" + id + ")", fmt.Sprintf("no mount of device %s holds %s", id, path)}
	}
	return best, nil
}

func within(path, dir string) bool {
	return dir == "/" || path == dir || strings.HasPrefix(path, dir+"/")
}

// parseMountinfo reads "id parent major:minor root point opts [tags] -
// fstype source superopts".
func parseMountinfo(line string) (mount, bool) {
	f := strings.Fields(line)
	sep := slices.Index(f, "-")
	if sep < 6 || len(f) < sep+4 {
		return mount{}, false
	}
	return mount{dev: f[2], point: unescapeMount(f[4]), fstype: f[sep+1], source: unescapeMount(f[sep+2]), superOpts: f[sep+3]}, true
}

// unescapeMount undoes the octal escapes (\040 for a space) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// SectorsWritten returns the sectors written to d since boot, from
// /proc/diskstats, or from the device's stat file in sysfs. A sector is
// SectorBytes.
func (h Host) SectorsWritten(d Device) (uint64, error) {
	if b, err := os.ReadFile(h.path("proc/diskstats")); err == nil {
		n, found, err := parseDiskstats(string(b), d.Major, d.Minor)
		if found || err != nil {
			return n, err
		}
	}
	b, err := os.ReadFile(h.path(fmt.Sprintf("sys/dev/block/%d:%d/stat", d.Major, d.Minor)))
	if err != nil {
		return 0, fmt.Errorf("device: no statistics for %s: %w", d, err)
	}
	return parseBlockStat(string(b))
}

// parseDiskstats returns the sectors written of device major:minor in
// /proc/diskstats, whose lines are "major minor name" then the fields of
// a stat file, and whether the device is listed.
func parseDiskstats(text string, major, minor uint32) (uint64, bool, error) {
	ma, mi := strconv.Itoa(int(major)), strconv.Itoa(int(minor))
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != ma || f[1] != mi {
			continue
		}
		n, err := parseBlockStat(strings.Join(f[3:], " "))
		if err != nil {
			return 0, true, fmt.Errorf("device: unexpected /proc/diskstats line %q", line)
		}
		return n, true, nil
	}
	return 0, false, nil
}

// parseBlockStat returns the sectors written from a stat file: reads
// completed, reads merged, sectors read, time reading, writes completed,
// writes merged, sectors written, and more that are not needed.
func parseBlockStat(text string) (uint64, error) {
	f := strings.Fields(text)
	if len(f) < 7 {
		return 0, fmt.Errorf("device: unexpected block statistics %q", text)
	}
	n, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("device: unexpected block statistics %q", text)
	}
	return n, nil
}

// Devices returns the distinct block devices holding dirs, in the order
// first found; a directory that does not exist yet is looked up by its
// nearest existing parent. It fails as Find does on the first directory
// without a device.
func (h Host) Devices(dirs []string) ([]Device, error) {
	var ds []Device
	for _, dir := range dirs {
		d, err := h.Find(dir)
		for errors.Is(err, fs.ErrNotExist) && filepath.Dir(dir) != dir {
			dir = filepath.Dir(dir)
			d, err = h.Find(dir)
		}
		if err != nil {
			return nil, err
		}
		if !slices.Contains(ds, d) {
			ds = append(ds, d)
		}
	}
	return ds, nil
}
