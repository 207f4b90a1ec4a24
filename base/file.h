/*
 * base/file.h: opening a file that a user named (a config key, the config
 * file itself) for reading, as a regular file, without blocking.
 *
 * open(2) of a FIFO for reading blocks until a writer comes, and a device
 * may block or become the controlling terminal; a check after the open
 * comes too late. ds_file_open_regular opens with O_NONBLOCK | O_NOCTTY |
 * O_CLOEXEC, so the open returns at once whatever the path names, refuses
 * what fstat does not call a regular file, and then clears O_NONBLOCK, so
 * the caller reads the descriptor as usual.
 */
#ifndef DS_BASE_FILE_H
#define DS_BASE_FILE_H

#include <stddef.h>
#include <sys/stat.h>

/* Open path read-only as a regular file. Returns the descriptor (the
 * caller closes it), or a negative errno with a short reason in why
 * (why_len bytes; NULL/0 allowed), without the path:
 *   strerror's text for a failed open or fstat ("No such file or directory");
 *   -EISDIR, "Is a directory", for a directory;
 *   -EINVAL, "not a regular file (a FIFO)" (a socket, a character device,
 *   a block device) for anything else that is not a regular file.
 * st (may be NULL) receives the fstat of the opened file. */
int ds_file_open_regular(const char *path, struct stat *st, char *why, size_t why_len);

/* "a FIFO", "a directory", "a socket", "a character device", "a block
 * device", "a symbolic link", "a regular file" or "an unknown kind of file". */
const char *ds_file_kind(mode_t mode);

#endif
