/*
 * replay.c - runs a fuzz target over files and directories without libFuzzer, so the
 * saved corpus is exercised by every ordinary build (zstd's regression driver).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 1;
    uint8_t *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        if (!got) break;
        len += got;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, len);
    /* Every prefix too: truncation is the commonest corruption. */
    for (size_t cut = 0; cut < len; cut += 1 + len / 64) LLVMFuzzerTestOneInput(buf, cut);
    free(buf);
    return 0;
}

int main(int argc, char **argv) {
    size_t files = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: cannot read %s\n", argv[i]);
            return 1;
        }
        if (S_ISDIR(st.st_mode)) {
            DIR *d = opendir(argv[i]);
            struct dirent *e;
            while (d && (e = readdir(d))) {
                if (e->d_name[0] == '.') continue;
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
                if (run_file(path) == 0) files++;
            }
            if (d) closedir(d);
        } else if (run_file(argv[i]) == 0) {
            files++;
        }
    }
    printf("replay: %zu inputs, no crash\n", files);
    return files ? 0 : 1;
}
