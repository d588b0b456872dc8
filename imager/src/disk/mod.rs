//! Disk: GPT layout, FAT filesystems, partition windows.
