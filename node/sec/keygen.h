/*
 * node/sec/keygen.h: `dsnode keygen`, the key-making command.
 *
 *   dsnode keygen --out F [--name NAME] [--force]
 *       A new Ed25519 identity: F (secret, mode 0600) and F.pub (a line for
 *       cluster.allowed_keys: hex key, then NAME if given). Prints that
 *       line on stdout.
 *   dsnode keygen --cluster --out F [--force]
 *       A new 32-byte cluster key in F (mode 0600). Prints nothing secret.
 *
 * Existing files are never overwritten without --force; with it they are
 * replaced atomically. File formats: docs/security.md.
 */
#ifndef DS_NODE_KEYGEN_H
#define DS_NODE_KEYGEN_H

/* argv[0] is "keygen". Returns the process exit status: 0 done, 1 failed
 * (message on stderr), 2 usage error. */
int ds_keygen_main(int argc, char **argv);

#endif
