/*
 * node/sec/keygen.c: `dsnode keygen` (see keygen.h). The work is in keys.c;
 * this file is argument parsing and messages, kept apart so main.c's
 * command table needs one row and tests can run the command in-process.
 */
#include "config.h"

#include "node/sec/keygen.h"

#include <stdio.h>
#include <string.h>

#include "node/sec/crypto.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: dsnode keygen --out FILE [--name NAME] [--force]\n"
               "       dsnode keygen --cluster --out FILE [--force]\n"
               "\n"
               "  --out FILE   identity: FILE (secret, mode 0600) and FILE.pub\n"
               "               cluster key: FILE (mode 0600)\n"
               "  --name NAME  node name to put after the key in FILE.pub\n"
               "  --cluster    make a 32-byte cluster key (every holder is trusted)\n"
               "  --force      replace existing files\n");
}

/* Accepts "--opt VALUE" and "--opt=VALUE". */
static int opt_value(int argc, char **argv, int *i, const char *opt, const char **val)
{
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0)
        return 0;
    if (argv[*i][n] == '=') {
        *val = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        *val = NULL;
        return 1;
    }
    *val = argv[++*i];
    return 1;
}

int ds_keygen_main(int argc, char **argv)
{
    const char *out = NULL, *name = NULL;
    int cluster = 0, force = 0;
    char err[512] = "";
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--cluster")) {
            cluster = 1;
        } else if (!strcmp(argv[i], "--force")) {
            force = 1;
        } else if (opt_value(argc, argv, &i, "--out", &v)) {
            if (!v || !*v) {
                fprintf(stderr, "dsnode keygen: --out needs a file name\n");
                return 2;
            }
            out = v;
        } else if (opt_value(argc, argv, &i, "--name", &v)) {
            if (!v || !*v) {
                fprintf(stderr, "dsnode keygen: --name needs a value\n");
                return 2;
            }
            name = v;
        } else {
            fprintf(stderr, "dsnode keygen: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "dsnode keygen: --out FILE is required\n");
        usage(stderr);
        return 2;
    }
    if (cluster && name) {
        fprintf(stderr, "dsnode keygen: --name applies to identities, not --cluster\n");
        return 2;
    }
    if (ds_crypto_init() != 0) {
        fprintf(stderr, "dsnode keygen: libsodium failed to initialise\n");
        return 1;
    }

    int rc;
    if (cluster) {
        ds_cluster_key k;
        rc = ds_cluster_key_generate(&k);
        if (rc == 0)
            rc = ds_cluster_key_save(&k, out, force, err, sizeof(err));
        ds_cluster_key_wipe(&k);
        if (rc) {
            fprintf(stderr, "dsnode keygen: %s\n", err[0] ? err : "cannot create the key");
            return 1;
        }
        fprintf(stderr, "dsnode keygen: wrote cluster key %s (mode 0600). Every holder of it "
                        "is a fully trusted member.\n", out);
        return 0;
    }

    ds_identity id;
    rc = ds_identity_generate(&id);
    if (rc == 0)
        rc = ds_identity_save(&id, out, name, force, err, sizeof(err));
    if (rc) {
        ds_identity_wipe(&id);
        fprintf(stderr, "dsnode keygen: %s\n", err[0] ? err : "cannot create the identity");
        return 1;
    }
    char hex[2 * DS_PK_BYTES + 1];
    ds_pk_to_hex(id.pk, hex);
    ds_identity_wipe(&id);
    printf("%s%s%s\n", hex, name ? " " : "", name ? name : "");
    fflush(stdout);
    fprintf(stderr, "dsnode keygen: wrote %s (secret, mode 0600) and %s.pub\n", out, out);
    return 0;
}
