package mqstore.spark;

import java.util.Map;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("mqstore")}: the Python data source {@code pipeline.source}
 * (registered in the session as {@value #PYTHON_NAME}) with column pruning.
 *
 * <p>Spark's Python data sources read every column of their schema: the JVM side of
 * Spark 4 ({@code PythonScanBuilder}) takes no required columns, so a query on one column
 * has the Python reader build all of them and ship them through Arrow to the JVM. This
 * provider is that same Python source behind a scan builder that does take them
 * ({@code SupportsPushDownRequiredColumns}): the Python reader is given the pruned schema
 * and builds only those columns. Planning and reading stay in Python.
 */
public final class MqStoreProvider implements TableProvider, DataSourceRegister {
  /** The name {@code pipeline.source.register} gives the Python source in the session. */
  public static final String PYTHON_NAME = "mqstore_python";

  @Override
  public String shortName() {
    return "mqstore";
  }

  // the handle inferSchema asked (it keeps the source it created in Python), for getTable
  private PythonDataSourceV2 inferred;

  /**
   * A fresh handle on the Python source. Spark's handle keeps one read plan, which its
   * scan uses whatever columns that scan reads, so every scan gets a handle of its own.
   */
  static PythonDataSourceV2 python() {
    PythonDataSourceV2 ds = new PythonDataSourceV2();
    ds.setShortName(PYTHON_NAME);
    return ds;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    inferred = python();
    return inferred.inferSchema(options);
  }

  @Override
  public Table getTable(
      StructType schema, Transform[] partitioning, Map<String, String> properties) {
    return new MqStoreTable(schema, inferred != null ? inferred : python());
  }

  @Override
  public boolean supportsExternalMetadata() {
    return true;
  }
}
