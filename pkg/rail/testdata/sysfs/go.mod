// Sysfs fixture trees of pkg/rail, kept out of the pxn module zip.
module pxn.invalid/rail/testdata/sysfs
