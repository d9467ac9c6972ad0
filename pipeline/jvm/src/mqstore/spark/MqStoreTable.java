package mqstore.spark;

import java.util.EnumSet;
import java.util.HashMap;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.Column;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceCreationResult;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceReadInfo;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.execution.datasources.v2.python.PythonScan;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import scala.Option;
import scala.collection.immutable.Seq;

/**
 * One loaded store: every query on the DataFrame scans it.
 *
 * <p>What a DataFrame reads is decided once, at its first query (the Python source's
 * docstring): the partitions (segments, byte ranges, a live store's flushed offset) that
 * the first scan plans are kept here, and every later scan, whatever columns it reads,
 * reads those partitions with a read function made for its own columns. The source
 * created in Python and each column set's read function are made once per DataFrame
 * (each is a call to a Python worker on the driver).
 */
final class MqStoreTable implements SupportsRead {
  private final StructType schema;
  private final PythonDataSourceV2 python; // holds the source created in Python
  private Seq<byte[]> partitions; // the first scan's plan, pickled by the Python source
  private final Map<StructType, PythonDataSourceReadInfo> reads = new HashMap<>();

  MqStoreTable(StructType schema, PythonDataSourceV2 python) {
    this.schema = schema;
    this.python = python;
  }

  @Override
  public String name() {
    return "mqstore";
  }

  @Override
  public Column[] columns() {
    StructField[] fields = schema.fields();
    Column[] out = new Column[fields.length];
    for (int i = 0; i < fields.length; i++) {
      out[i] = Column.create(fields[i].name(), fields[i].dataType(), fields[i].nullable());
    }
    return out;
  }

  @Override
  public Set<TableCapability> capabilities() {
    return EnumSet.of(TableCapability.BATCH_READ);
  }

  @Override
  public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
    return new Builder(options);
  }

  /** The read function for `columns`, over the partitions of the table's first scan. */
  synchronized PythonDataSourceReadInfo readInfo(
      StructType columns, CaseInsensitiveStringMap options) {
    PythonDataSourceReadInfo known = reads.get(columns);
    if (known != null) {
      return known;
    }
    PythonDataSourceCreationResult created =
        python.getOrCreateDataSourceInPython(
            MqStoreProvider.PYTHON_NAME, options, Option.apply(schema));
    PythonDataSourceReadInfo info = python.source().createReadInfoInPython(created, columns, false);
    if (partitions == null) {
      partitions = info.partitions();
    } else {
      info = PythonDataSourceReadInfo.apply(info.func(), partitions);
    }
    reads.put(columns, info);
    return info;
  }

  private final class Builder implements ScanBuilder, SupportsPushDownRequiredColumns {
    private final CaseInsensitiveStringMap options;
    private StructType required;

    Builder(CaseInsensitiveStringMap options) {
      this.options = options;
      this.required = schema;
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
      // a query that needs no column (count()) still needs rows: read the cheapest one
      required =
          requiredSchema.isEmpty()
              ? new StructType(new StructField[] {schema.fields()[0]})
              : requiredSchema;
    }

    @Override
    public Scan build() {
      PythonDataSourceV2 ds = MqStoreProvider.python();
      ds.setReadInfo(readInfo(required, options));
      return new PythonScan(ds, MqStoreProvider.PYTHON_NAME, required, options, new Filter[0]);
    }
  }
}
