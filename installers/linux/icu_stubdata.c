/* An empty ICU data package, the same as ICU's own `stubdata` library: the bundle's
 * libicudata.so.<N> (31 MiB of locale, collation, time-zone name and codec tables) is replaced by
 * this one (installers/llm-tray.spec). Qt then falls back to its own tables: case mapping, number
 * and date formats are unchanged; lost: locale-aware collation (QCollator compares code points),
 * long time-zone names (the IANA id instead) and codecs other than UTF-8/16/32 and Latin-1 —
 * none of which llm-tray uses. Build: cc -shared -fPIC -DICU_MAJOR=73 -Wl,-soname,libicudata.so.73 */
#include <stdint.h>

#ifndef ICU_MAJOR
#error "define ICU_MAJOR, the major version in the library's name (libicudata.so.73: 73)"
#endif
#define ICU_ENTRY_(major) icudt##major##_dat
#define ICU_ENTRY(major) ICU_ENTRY_(major)

struct icu_data_header {  /* ICU's MappedData header, its UDataInfo, then an empty table of contents */
    uint16_t header_size;
    uint8_t magic1, magic2;
    uint16_t info_size, info_reserved;
    uint8_t is_big_endian, charset_family, sizeof_uchar, reserved_byte;
    uint8_t data_format[4], format_version[4], data_version[4];
    uint8_t padding[8];
    uint32_t count, reserved;
    uint64_t empty_toc[2];
};

__attribute__((visibility("default"), aligned(16)))
const struct icu_data_header ICU_ENTRY(ICU_MAJOR) = {
    .header_size = 32, .magic1 = 0xda, .magic2 = 0x27,
    .info_size = 20, .is_big_endian = 0, .charset_family = 0 /* ASCII */, .sizeof_uchar = 2,
    .data_format = {'T', 'o', 'C', 'P'}, .format_version = {1, 0, 0, 0},
    .count = 0,  /* no files: every lookup misses, as with ICU's stubdata */
};
